"""The episode's token stream through the model's own chat template (`tokenizer.chat_template`, run
by `apply_chat_template` as vLLM's chat endpoint runs it), piece by piece and append-only, with the
same methods as `ChatMLRenderer`, which stays the fallback for a tokenizer without a template.

Every piece is cut out of a full rendering: the prompt is the template's text for (system, user)
with the generation prompt; the piece after a reply is what the template writes between an
assistant turn's content and the next generation prompt (found with a sentinel content, so it does
not depend on how the template shows the reply); an earlier turn re-rendered (history=r2egym) is
the template's text for that turn, the opening it retokenises taken back as in ChatML. The
template re-renders earlier assistant turns (Qwen3 drops their `<think>` blocks); the stream is
never re-rendered: the loop's history rule makes it match (docs/deepswe.md, "chat template").

Special-token text inside a message (a literal `<|im_end|>` in a file, an issue, a reply) stays
text, as in `ChatMLRenderer`; only the tokens the template itself writes are special. vLLM
tokenises the rendered string whole, so there such text becomes the special token and can close
a turn early: kvagent keeps the turn structure the model was given (`vllm_ids` shows vLLM's)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvagent.agent.render import ChatMLRenderer
from kvagent.errors import KvagentError

# Stand-in contents for probe renderings and for special-token text inside a message: private-use
# characters no template touches (a message holding them is refused, not mis-rendered).
SENTINEL = "\ue000kvagent-{}\ue000"
PROBE = [
    {"role": "system", "content": SENTINEL.format("s")},
    {"role": "user", "content": SENTINEL.format("u")},
]


def template_source(tokenizer: Any) -> str:
    t = getattr(tokenizer, "chat_template", None)
    if isinstance(t, dict):  # named templates: the default one renders chats
        t = t.get("default") or next(iter(t.values()), None)
    return t if isinstance(t, str) else ""


class TemplateRenderer(ChatMLRenderer):
    name = "chat_template"

    def __init__(self, tokenizer: Any) -> None:
        if not template_source(tokenizer):
            raise KvagentError("the tokenizer has no chat template; use ChatMLRenderer")
        self.tokenizer = tokenizer
        specials = [t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values() if t.special]
        # longest first, so a token that contains another is matched whole
        self.specials = sorted(set(specials), key=len, reverse=True)
        self.special_ids = {s: tokenizer.convert_tokens_to_ids(s) for s in self.specials}
        self._newline = self.encode("\n")
        head = self._text(PROBE, True)
        self.generation_prompt = head[len(self._text(PROBE, False)) :]
        if not head.endswith(self.generation_prompt) or not self.generation_prompt:
            raise KvagentError("the chat template writes no generation prompt after a user turn")
        self.im_end = self._after_reply("x")[0]  # the token that ends a turn (ChatML: <|im_end|>)

    # ------------------------------------------------------------------ text and ids
    def _protect(self, text: str) -> str:
        if SENTINEL.split("{")[0] + "special" in text:
            raise KvagentError("a message holds kvagent's private-use sentinel text; remove it")
        for i, s in enumerate(self.specials):
            text = text.replace(s, SENTINEL.format(f"special{i}"))
        return text

    def _restore(self, text: str) -> str:
        for i, s in enumerate(self.specials):
            text = text.replace(SENTINEL.format(f"special{i}"), s)
        return text

    def _text(self, messages: Sequence[dict[str, str]], generation_prompt: bool) -> str:
        safe = [{**m, "content": self._protect(m["content"])} for m in messages]
        return self.tokenizer.apply_chat_template(
            safe, tokenize=False, add_generation_prompt=generation_prompt
        )

    def _ids(self, text: str) -> list[int]:
        """Ids of a rendered (protected) text: the template's special tokens as such, each run of text
        between them tokenised as one piece with message special-token text restored as text."""
        ids: list[int] = []
        start = 0
        while start < len(text):
            hits = [(text.find(s, start), s) for s in self.specials]
            at, token = min(((i, s) for i, s in hits if i >= 0), default=(len(text), ""))
            if at > start:
                ids += self.encode(self._restore(text[start:at]))
            if token:
                ids.append(self.special_ids[token])
            start = at + len(token)
        return ids

    def render_ids(self, messages: Sequence[dict[str, str]], generation_prompt: bool = True) -> list[int]:
        """A whole conversation as the template renders it (kvagent's special-token rule)."""
        return self._ids(self._text(messages, generation_prompt))

    def vllm_ids(self, messages: Sequence[dict[str, str]], generation_prompt: bool = True) -> list[int]:
        """The same as vLLM's chat endpoint tokenises it: the rendered string whole, so special-token
        text inside a message becomes the special token."""
        text = self.tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=generation_prompt
        )
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    # ------------------------------------------------------------------ the stream's pieces
    def prompt_ids(self, system: str, user: str) -> list[int]:
        return self.render_ids([{"role": "system", "content": system}, {"role": "user", "content": user}])

    def assistant_open(self) -> list[int]:
        return self._ids(self.generation_prompt)

    def _after_reply(self, user: str) -> list[int]:
        """What the template writes after an assistant turn's content up to the next generation
        prompt, with `user` as the next user turn."""
        mark = SENTINEL.format("reply")
        text = self._text(
            [*PROBE, {"role": "assistant", "content": mark}, {"role": "user", "content": user}], True
        )
        return self._ids(text[text.index(mark) + len(mark) :])

    def _close_len(self, ids: Sequence[int]) -> int:
        """How many of `ids` (what follows a turn's content) close the turn: up to the second
        special token (ChatML: `<|im_end|>` and the newline)."""
        seen = 0
        for i, t in enumerate(ids):
            if t in self.special_ids.values():
                seen += 1
                if seen == 2:
                    return i
        return len(ids)

    def observation_ids(self, observation: str, reply_ids: Sequence[int]) -> list[int]:
        ids = self._after_reply(observation)
        ended = bool(reply_ids) and reply_ids[-1] == ids[0]  # the reply sampled its end-of-turn token
        return ids[1:] if ended else ids

    def user_turn_ids(self, text: str) -> list[int]:
        ids = self._after_reply(text)
        return ids[self._close_len(ids) :]

    def assistant_turn_ids(self, content: str, retokenise_opening: bool = True) -> tuple[int, list[int]]:
        """(k, ids) as ChatMLRenderer's: the template's text for an earlier assistant turn of
        `content`, closed, after the stream's opening; k opening tokens taken back first."""
        head = self.render_ids(PROBE)
        mark = SENTINEL.format("next")
        full = self.render_ids(
            [*PROBE, {"role": "assistant", "content": content}, {"role": "user", "content": mark}]
        )
        common = next(
            (i for i, (a, b) in enumerate(zip(head, full, strict=False)) if a != b), min(len(head), len(full))
        )
        rest = full[common:]
        end = next(i for i, t in enumerate(rest) if t in self.special_ids.values())  # the turn's end
        close = rest[end : end + self._close_len(rest[end:])]
        if common == len(head):
            return 0, [*rest[:end], *close]
        if not retokenise_opening:  # the opening stays: the content tokenised on its own
            return 0, [*self.encode(content), *close]
        return len(head) - common, [*rest[:end], *close]


def make_renderer(tokenizer: Any) -> ChatMLRenderer:
    """The model's own chat template where its tokenizer has one that renders a plain conversation,
    else kvagent's ChatML renderer."""
    if template_source(tokenizer):
        try:
            return TemplateRenderer(tokenizer)
        except Exception:  # a template that cannot render (system, user): ChatML, as before
            pass
    return ChatMLRenderer(tokenizer)
