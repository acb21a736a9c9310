"""Sampling a reply: `Session.generate`'s token loop (sample, feed, stop on EOS, a stop string or
the caller's `on_token`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from kvagent.errors import ConfigError
from kvagent.runtime.config import Sampling
from kvagent.runtime.sampling import sample_next

if TYPE_CHECKING:
    from kvagent.runtime.session import Session


@dataclass
class Generation:
    ids: list[int]
    text: str
    finish_reason: str  # "eos" | "stop" | "length" | "interrupted"


def generate_tokens(
    session: Session,
    max_new_tokens: int,
    sampling: Sampling,
    stop: Sequence[str] | None,
    on_token: Callable[[int], bool] | None,
) -> Generation:
    """Every sampled id (the last too) is fed through `session.step`; see `Session.generate`."""
    if session._last_logits is None:
        raise ConfigError(f"generate: {session._no_logits()}")
    if session._stale:
        raise ConfigError("generate: forget() changed this reprefill session's history; append first")
    stops = [s for s in (stop or []) if s]
    eos = session.engine.eos_token_ids
    tok = session.engine.tokenizer
    if session._sample_gen is None:
        session._sample_gen = torch.Generator().manual_seed(
            sampling.seed if sampling.seed is not None else session.config.seed
        )
    out: list[int] = []
    reason = "length"
    logits = session._last_logits
    tail_span = max((len(s) for s in stops), default=0) + 16
    for _ in range(max_new_tokens):
        token = sample_next(logits, sampling, session._sample_gen)
        out.append(token)
        logits = session.step(token)
        halt = on_token is not None and on_token(token)
        if token in eos:
            reason = "eos"
            break
        if stops:
            tail = tok.decode(out[-tail_span:], skip_special_tokens=False)
            if any(s in tail for s in stops):
                reason = "stop"
                break
        if halt:
            reason = "interrupted"
            break
    text_ids = out[:-1] if reason == "eos" else out
    return Generation(ids=out, text=tok.decode(text_ids, skip_special_tokens=False), finish_reason=reason)
