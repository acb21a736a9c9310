"""Next-token sampling: greedy, temperature, top-k, top-p, all from a seeded generator."""

from __future__ import annotations

import torch

from kvagent.runtime.config import Sampling


def sample_next(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator) -> int:
    if sampling.greedy:
        return int(logits.argmax().item())
    scores = logits.detach().float().cpu() / sampling.temperature
    if sampling.top_k and sampling.top_k < scores.numel():
        kth = scores.topk(sampling.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_scores, order = scores.sort(descending=True)
        probs = sorted_scores.softmax(-1)
        # Drop tokens once the mass BEFORE them already reaches top_p (the top token always stays).
        drop = probs.cumsum(-1) - probs >= sampling.top_p
        scores[order[drop]] = float("-inf")
    probs = scores.softmax(-1)
    return int(torch.multinomial(probs, 1, generator=generator).item())
