"""Sampling a reply: `Session.generate`'s token loop (sample, feed, stop), and the reply's text as it
grows. It sees the session only through the `step` it is handed.

The reply ends at `max_new_tokens`, the model's context, an EOS (unless `ignore_eos`), a stop token
id, a stop string, or when the caller's `on_token` says so; `min_tokens` holds off EOS, stop ids and
stop strings until that many tokens are out (OpenAI's and vLLM's request options, which `kvagent
serve` passes through unchanged, so a server reply is this loop's reply on the same token stream)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from kvagent.errors import ConfigError
from kvagent.runtime.config import Sampling
from kvagent.runtime.sampling import sample_next


@dataclass(frozen=True)
class Stopping:
    """When a reply ends besides its length, and what its text keeps."""

    stop: Sequence[
        str
    ] = ()  # stop strings: the text ends before the first one (after it, if include_stop_str)
    stop_token_ids: Sequence[int] = ()  # ids that end the reply like EOS (left out of the text)
    min_tokens: int = 0  # EOS, stop ids and stop strings held off until this many tokens
    ignore_eos: bool = False  # EOS is a token like any other
    include_stop_str: bool = False
    skip_special_tokens: bool = False  # of the text (stop strings are matched in that text)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            raise ConfigError(f"stop: pass a list of strings, got the string {self.stop!r}")
        if any(not isinstance(s, str) for s in self.stop):
            raise ConfigError(f"stop: every stop is a string, got {list(self.stop)!r}")
        if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise ConfigError(f"stop_token_ids: token ids are ints >= 0, got {list(self.stop_token_ids)!r}")
        if isinstance(self.min_tokens, bool) or not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise ConfigError(f"min_tokens: must be an int >= 0, got {self.min_tokens!r}")


@dataclass
class Generation:
    ids: list[int]  # every sampled id, all fed to the session (the EOS / stop id too)
    text: str  # the reply's text: the EOS / stop id left out, cut before a stop string
    finish_reason: str  # "eos" | "stop" | "length" | "interrupted"
    stop: str | int | None = None  # the stop string or token id (EOS included) that ended it
    first_token_at: float | None = None  # time.perf_counter() once the first id was sampled


class Detokenizer:
    """The text of a growing reply, a piece at a time. Each new piece is the decode of the ids from
    an earlier offset minus the decode of the part already committed (so tokenizers whose lone
    pieces decode differently, such as SentencePiece's leading spaces, come out whole); it is
    committed once it no longer ends in an incomplete UTF-8 sequence. `current` is the committed
    text and the whole characters of the piece not yet committed."""

    def __init__(self, tokenizer, skip_special_tokens: bool = False) -> None:
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        self.ids: list[int] = []
        self.prefix = 0  # ids[prefix:read]: the committed piece the next one is decoded after
        self.read = 0
        self.text = ""
        self.pending = ""

    @property
    def current(self) -> str:
        return self.text + self.pending

    def push(self, token: int) -> None:
        self.ids.append(int(token))
        self._commit(final=False)

    def flush(self) -> str:
        self._commit(final=True)
        return self.text

    def _commit(self, final: bool) -> None:
        if self.read == len(self.ids):
            return
        shown = self._decode(self.ids[self.prefix : self.read])
        grown = self._decode(self.ids[self.prefix :])
        piece = grown[len(shown) :] if len(grown) > len(shown) else ""
        if final or (piece and not piece.endswith("\ufffd")):
            self.text += piece
            self.prefix, self.read = self.read, len(self.ids)
            self.pending = ""
        else:
            self.pending = piece.rstrip("\ufffd")

    def _decode(self, ids: list[int]) -> str:
        if not ids:
            return ""
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip, clean_up_tokenization_spaces=False)


def held_back(text: str, stops: Sequence[str]) -> int:
    """Characters at the end of `text` that could begin a stop string (not yet safe to show)."""
    hold = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), hold, -1):
            if text.endswith(s[:k]):
                hold = k
                break
    return hold


def generate_tokens(
    step: Callable[[int], torch.Tensor],
    logits: torch.Tensor,
    max_new_tokens: int,
    sampling: Sampling,
    generator: torch.Generator,
    tokenizer,
    eos: set[int],
    stopping: Stopping,
    on_token: Callable[[int], bool] | None = None,
    on_text: Callable[[str], None] | None = None,
) -> Generation:
    """From `logits` (the last token's), sample and feed each id through `step` (the last too);
    see `Session.generate`."""
    stops = [s for s in stopping.stop if s]
    stop_ids = set(stopping.stop_token_ids)
    ends = (set() if stopping.ignore_eos else set(eos)) | stop_ids
    vocab = logits.shape[-1]  # ids past the model's logits (a tokenizer's extra EOS) cannot be sampled
    masked = torch.tensor(sorted(t for t in set(eos) | stop_ids if t < vocab), dtype=torch.long)
    longest = max((len(s) for s in stops), default=0)
    text = Detokenizer(tokenizer, stopping.skip_special_tokens)
    out: list[int] = []
    reason, matched, first_at, shown, now = "length", None, None, 0, ""
    while len(out) < max_new_tokens:
        if len(out) < stopping.min_tokens and len(masked):
            logits = logits.clone()
            logits[masked.to(logits.device)] = float("-inf")
        token = sample_next(logits, sampling, generator)
        first_at = first_at or time.perf_counter()
        out.append(token)
        logits = step(token)
        halt = on_token is not None and on_token(token)
        if token in ends:
            reason, matched = ("stop" if token in stop_ids else "eos"), token
            break
        seen = len(now)
        text.push(token)
        now = text.current
        if stops and len(out) >= stopping.min_tokens and len(now) > seen:
            start = max(0, seen - longest + 1)  # a stop may begin in text already shown
            window = now[start:]
            hits = [(window.find(s), s) for s in stops if s in window]
            if hits:
                at, s = min(hits)
                now = now[: start + at + (len(s) if stopping.include_stop_str else 0)]
                reason, matched = "stop", s
                break
        if on_text is not None:
            safe = len(now) - held_back(now, stops)
            if safe > shown:
                shown = safe
                on_text(now[:safe])
        if halt:
            reason = "interrupted"
            break
    final = now if isinstance(matched, str) else text.flush()
    if on_text is not None and len(final) > shown:
        on_text(final)
    return Generation(ids=out, text=final, finish_reason=reason, stop=matched, first_token_at=first_at)
