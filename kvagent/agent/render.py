"""Token rendering for ChatML models (Qwen3, Qwen2, SmolLM2), append-only.

The episode's token stream is built once, piece by piece: the prompt, then each sampled reply
verbatim, then each observation. It is never re-rendered whole (Qwen3's template drops old `<think>`
blocks, which would put the cache out of step with the text; the history rules take them back
instead). The fallback for a tokenizer without a chat template: template_render.py cuts the same
pieces out of the model's own template, and gives these ids on Qwen3's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvagent.errors import KvagentError

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"


class ChatMLRenderer:
    name = "chatml"  # the trajectory's `renderer`

    def __init__(self, tokenizer: Any) -> None:
        vocab = tokenizer.get_vocab()
        missing = [t for t in (IM_START, IM_END) if t not in vocab]
        if missing:
            raise KvagentError(
                f"tokenizer has no {' / '.join(missing)} token: the agent renders ChatML only "
                "(Qwen3, Qwen2, SmolLM2); use a ChatML model"
            )
        self.tokenizer = tokenizer
        self.im_start = vocab[IM_START]
        self.im_end = vocab[IM_END]
        self._newline = self.encode("\n")

    def encode(self, text: str) -> list[int]:
        # split_special_tokens: a literal "<|im_end|>" inside a file or an issue stays plain text and
        # cannot close the turn early.
        return list(self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def _turn_open(self, role: str, content: str) -> list[int]:
        return [self.im_start, *self.encode(f"{role}\n{content}"), self.im_end, *self._newline]

    def prompt_ids(self, system: str, user: str) -> list[int]:
        """`<|im_start|>system ... <|im_end|> <|im_start|>user ... <|im_end|> <|im_start|>assistant\\n`."""
        return [*self._turn_open("system", system), *self._turn_open("user", user), *self.assistant_open()]

    def assistant_open(self) -> list[int]:
        return [self.im_start, *self.encode("assistant\n")]

    def observation_ids(self, observation: str, reply_ids: Sequence[int]) -> list[int]:
        """Close the reply (unless it already ended on `<|im_end|>`), add the user turn, reopen assistant."""
        ended = bool(reply_ids) and reply_ids[-1] == self.im_end
        close = self._newline if ended else [self.im_end, *self._newline]
        return [*close, *self.user_turn_ids(observation)]

    def user_turn_ids(self, text: str) -> list[int]:
        """A user turn, then the next assistant turn opened."""
        return [*self._turn_open("user", text), *self.assistant_open()]

    def assistant_turn_ids(self, content: str, retokenise_opening: bool = True) -> tuple[int, list[int]]:
        """(k, ids) for an assistant turn of `content`, closed, as a chat template renders it,
        when the stream already holds the turn's opening `<|im_start|>assistant\n`: take back the
        opening's last k tokens, then append ids. The template's text between `<|im_start|>` and
        `<|im_end|>` is tokenised as one piece, so k is the opening's length when `content` begins
        with characters that merge with its newline (a blank line); 0 otherwise, and always 0 when
        the opening may not be taken back (`retokenise_opening` false: then `content` alone)."""
        opening = self.encode("assistant\n")
        whole = self.encode(f"assistant\n{content}")
        closing = [self.im_end, *self._newline]
        if whole[: len(opening)] == opening:
            return 0, [*whole[len(opening) :], *closing]
        if not retokenise_opening:
            return 0, [*self.encode(content), *closing]
        return len(opening), [*whole, *closing]

    @staticmethod
    def transcript(messages: Sequence[dict[str, str]]) -> str:
        """The text of the token stream that `messages` were rendered into (assistant contents are the
        decoded replies, verbatim). `decode(session.history) == transcript(messages)` always holds."""
        out = []
        for i, m in enumerate(messages):
            role, content = m["role"], m["content"]
            if role != "assistant":
                out.append(f"{IM_START}{role}\n{content}{IM_END}\n")
                if role == "user":
                    out.append(f"{IM_START}assistant\n")
            elif i + 1 < len(messages):
                out.append(content if content.endswith(IM_END) else content + IM_END)
                out.append("\n")
            else:
                out.append(content)
        return "".join(out)
