"""One reply's token loop over a Session, with what OpenAI and vLLM clients ask of it that
`Session.generate` does not do: a seed per request (a conversation's session serves many requests),
`min_tokens` (EOS and stop ids masked, stop strings ignored, until then), `ignore_eos`, stop token
ids, a stop string cut out of the text, text handed out as it grows (held back where it could
be the start of a stop string), and a cancel check after every token (client gone, shutdown).

With none of those set it is `Session.generate`'s loop: sample with `sample_next`, feed every
sampled id through `step` (the last one too), stop on EOS; so a greedy reply equals the library's
on the same token stream."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from kvagent.runtime import Sampling
from kvagent.runtime.sampling import sample_next


@dataclass
class DecodeSpec:
    max_tokens: int
    sampling: Sampling
    seed: int
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    min_tokens: int = 0
    ignore_eos: bool = False
    include_stop_str: bool = False
    skip_special_tokens: bool = False


@dataclass
class Decoded:
    ids: list[int]  # every sampled id (all fed to the session)
    text: str  # the reply's text: EOS / stop id left out, cut before a stop string
    finish_reason: str  # "stop" | "length" | "abort"
    stop: str | int | None = None  # the stop string or token id that ended it
    first_token_at: float | None = None  # time.perf_counter() when the first id was sampled


class Detokenizer:
    """Text of a growing reply, decoded a piece at a time: ids are committed once their text no
    longer ends in an incomplete UTF-8 sequence (byte-level BPE decodes such pieces concatenatively)."""

    def __init__(self, tokenizer, skip_special_tokens: bool) -> None:
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        self.ids: list[int] = []
        self.start = 0
        self.text = ""

    def push(self, token: int) -> None:
        self.ids.append(token)
        piece = self._decode(self.ids[self.start :])
        if not piece.endswith("\ufffd"):
            self.text += piece
            self.start = len(self.ids)

    def flush(self) -> str:
        if self.start < len(self.ids):
            self.text += self._decode(self.ids[self.start :])
            self.start = len(self.ids)
        return self.text

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip, clean_up_tokenization_spaces=False)


def held_back(text: str, stops: list[str]) -> int:
    """Characters at the end of `text` that could begin a stop string (not yet safe to hand out)."""
    hold = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), hold, -1):
            if text.endswith(s[:k]):
                hold = k
                break
    return hold


def decode(
    session,
    logits: torch.Tensor,
    spec: DecodeSpec,
    *,
    max_context: int | None = None,
    on_text: Callable[[str], None] | None = None,
    cancelled: Callable[[], bool] = lambda: False,
) -> Decoded:
    """Sample a reply from `logits` (the prompt's last). `on_text(text)` sees the reply's text so
    far whenever more of it is safe to show (never past a stop string)."""
    engine = session.engine
    eos = set() if spec.ignore_eos else set(engine.eos_token_ids)
    stop_ids = set(spec.stop_token_ids)
    masked = torch.tensor(sorted(set(engine.eos_token_ids) | stop_ids), dtype=torch.long)
    gen = torch.Generator().manual_seed(spec.seed)
    text = Detokenizer(engine.tokenizer, spec.skip_special_tokens)
    longest = max((len(s) for s in spec.stop), default=0)
    shown = 0
    out: list[int] = []
    reason, matched, first_at = "length", None, None
    active = engine.scheduler.active(session) if engine.scheduler is not None else contextlib.nullcontext()
    with active:  # the engine's scheduler waits for this session's next step between tokens
        while len(out) < spec.max_tokens:
            if max_context is not None and session.logical_length >= max_context:
                break
            if len(out) < spec.min_tokens and len(masked):
                logits = logits.clone()
                logits[masked.to(logits.device)] = float("-inf")
            token = sample_next(logits, spec.sampling, gen)
            out.append(token)
            first_at = first_at or time.perf_counter()
            logits = session.step(token)
            if token in eos or token in stop_ids:
                reason, matched = "stop", token
                break
            seen = len(text.text)
            text.push(token)
            if spec.stop and len(out) >= spec.min_tokens and len(text.text) > seen:
                window = text.text[max(0, seen - longest + 1) :]
                hits = [(window.find(s), s) for s in spec.stop if s in window]
                if hits:
                    at, s = min(hits)
                    cut = max(0, seen - longest + 1) + at
                    text.text = text.text[: cut + (len(s) if spec.include_stop_str else 0)]
                    reason, matched = "stop", s
                    break
            if on_text is not None:
                safe = len(text.text) - held_back(text.text, spec.stop)
                if safe > shown:
                    shown = safe
                    on_text(text.text[:safe])
            if cancelled():
                reason = "abort"
                break
    final = text.text if reason == "stop" and isinstance(matched, str) else text.flush()
    if on_text is not None and len(final) > shown:
        on_text(final)
    return Decoded(out, final, reason, matched, first_at)
