"""Next-token sampling: greedy, temperature, top-k, top-p, all from a seeded generator.

A sampled token costs one uniform draw from the generator, turned into a token by inverse-CDF
sampling (each token gets exactly its probability): the float64 mass of blocks of 1024 tokens, the
block the draw falls in, then the token within it. top-k is a partial selection (no sort of the
vocabulary); top-p looks at the largest few candidates first and widens only while they hold less
than `top_p` of the mass, so a full sort happens only for a nucleus near the whole vocabulary.

The vocabulary-wide work is numpy on the CPU, single-threaded, on purpose: a torch op over a 151k
vocabulary runs as a parallel region, and on a CPU whose cores are busy each region waits a
scheduling slice for its second thread (~17 ms here under load; the old sampler's ~6 such ops were
its 75-106 ms a token). Greedy on a GPU stays there (argmax, one id copied back)."""

from __future__ import annotations

import numpy as np
import torch

from kvagent.runtime.config import Sampling

_BLOCK = 1024  # tokens a block of the inverse CDF
_NUCLEUS_FIRST = 64  # candidates top-p looks at first; x8 while they hold less than top_p (a sort past half)
_NUCLEUS_GROWTH = 8


def sample_next(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator) -> int:
    logits = logits.detach()
    if sampling.greedy and logits.device.type != "cpu":
        return int(logits.argmax().item())
    x = logits.float().cpu().numpy().reshape(-1)
    if sampling.greedy:
        return int(np.argmax(x))  # the first of tied maxima, as torch.argmax
    scores = x / np.float32(sampling.temperature)
    ids = None  # scores[i] is token ids[i] (None: token i)
    if sampling.top_k and sampling.top_k < scores.size:
        ids = _largest(scores, sampling.top_k)
        scores = scores[ids]
    if sampling.top_p < 1.0:
        keep = _nucleus(scores, sorted_already=ids is not None, top_p=sampling.top_p)
        scores = scores[keep]
        ids = keep if ids is None else ids[keep]
    u = float(torch.rand((), generator=generator, dtype=torch.float64))
    i = _inverse_cdf(np.exp(scores - scores.max()), u)
    return int(ids[i]) if ids is not None else i


def _largest(scores: np.ndarray, m: int) -> np.ndarray:
    """Indices of the m largest scores, largest first."""
    part = np.argpartition(scores, -m)[-m:]
    return part[np.argsort(-scores[part])]


def _nucleus(scores: np.ndarray, sorted_already: bool, top_p: float) -> np.ndarray:
    """Indices (largest first) of the smallest set of largest-probability tokens whose mass reaches
    top_p: a token is dropped once the mass BEFORE it already reaches top_p (the top one always
    stays). If the m largest already hold top_p, every token past them is dropped, so only they
    need sorting."""
    n = scores.size
    weights = np.exp(scores - scores.max())
    total = weights.sum(dtype=np.float64)
    if sorted_already:  # after top-k: largest first, and short
        order = np.arange(n)
    else:
        m = min(_NUCLEUS_FIRST, n)
        while True:
            if 2 * m >= n:  # half the vocabulary or more: one sort
                order = np.argsort(-scores)
                break
            order = _largest(scores, m)
            if weights[order].sum(dtype=np.float64) >= top_p * total:
                break
            m *= _NUCLEUS_GROWTH
    probs = weights[order].astype(np.float64) / total
    keep = max(1, int(np.count_nonzero(np.cumsum(probs) - probs < top_p)))
    return order[:keep]


def _inverse_cdf(weights: np.ndarray, u: float) -> int:
    """Index i with probability weights[i] / sum(weights), from u uniform in [0, 1): the first i
    whose cumulative weight exceeds u x total (a weight of 0 adds no width, so it is never drawn).
    Two levels (the block, then the token in it) keep the cumulative sums short and in float64."""
    n = weights.size
    size = min(_BLOCK, n)
    pad = (-n) % size
    blocks = (np.concatenate([weights, np.zeros(pad, weights.dtype)]) if pad else weights).reshape(-1, size)
    cdf = np.cumsum(blocks.sum(1, dtype=np.float64))
    target = u * cdf[-1]
    b = int(np.searchsorted(cdf, target, side="right"))
    if b >= len(cdf):  # rounding at the very top: the last block with any weight
        b = int(np.flatnonzero(cdf < cdf[-1]).size)
    rest = target - (cdf[b - 1] if b else 0.0)
    inner = np.cumsum(blocks[b], dtype=np.float64)
    j = int(np.searchsorted(inner, rest, side="right"))
    if j >= size:  # rounding: the block's last token with any weight
        j = int(np.flatnonzero(blocks[b])[-1])
    return b * size + j
