"""Sampling a reply: `Session.generate`'s token loop (sample, feed, stop on EOS, a stop string or
the caller's `on_token`). It sees the session only through the `step` it is handed."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from kvagent.runtime.config import Sampling
from kvagent.runtime.sampling import sample_next


@dataclass
class Generation:
    ids: list[int]
    text: str
    finish_reason: str  # "eos" | "stop" | "length" | "interrupted"


def generate_tokens(
    step: Callable[[int], torch.Tensor],
    logits: torch.Tensor,
    max_new_tokens: int,
    sampling: Sampling,
    generator: torch.Generator,
    tokenizer,
    eos: set[int],
    stop: Sequence[str] | None,
    on_token: Callable[[int], bool] | None,
) -> Generation:
    """From `logits` (the last token's), sample and feed each id through `step` (the last too);
    see `Session.generate`."""
    stops = [s for s in (stop or []) if s]
    out: list[int] = []
    reason = "length"
    tail_span = max((len(s) for s in stops), default=0) + 16
    for _ in range(max_new_tokens):
        token = sample_next(logits, sampling, generator)
        out.append(token)
        logits = step(token)
        halt = on_token is not None and on_token(token)
        if token in eos:
            reason = "eos"
            break
        if stops:
            tail = tokenizer.decode(out[-tail_span:], skip_special_tokens=False)
            if any(s in tail for s in stops):
                reason = "stop"
                break
        if halt:
            reason = "interrupted"
            break
    text_ids = out[:-1] if reason == "eos" else out
    return Generation(
        ids=out, text=tokenizer.decode(text_ids, skip_special_tokens=False), finish_reason=reason
    )
