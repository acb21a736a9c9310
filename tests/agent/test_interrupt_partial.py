"""Ctrl-C in the middle of a reply (solve / eval, not chat): the partial episode keeps what the
model had already written, on the real session path."""

from __future__ import annotations

import pytest

from kvagent.agent import Agent, AgentConfig, ChatMLRenderer
from kvagent.agent.loop import EpisodeInterrupted
from kvagent.runtime import CacheConfig, Engine


@pytest.fixture(scope="module")
def tiny():
    return Engine.load("tiny-random-qwen3", device="cpu")


class CtrlCAfter(Agent):
    """Raises KeyboardInterrupt (what SIGINT does) from inside generation after `n` tokens."""

    n = 5

    def _generate(self, max_new_tokens):
        seen = []

        def on_token(token):
            seen.append(token)
            if len(seen) == self.n:
                raise KeyboardInterrupt

        return self.session.generate(max_new_tokens, on_token=on_token)


@pytest.mark.parametrize("mode", ["persistent", "reprefill"])
def test_ctrl_c_mid_reply_keeps_the_partial_reply(tiny, fake_env, mode):
    session = tiny.session(CacheConfig(policy="random", budget=256, buffer=32, protect="sink", mode=mode))
    agent = CtrlCAfter(session, fake_env, tiny.tokenizer, AgentConfig(max_steps=3, max_new_tokens=40))
    with pytest.raises(EpisodeInterrupted) as stop:
        agent.run("mean([1, 2, 3]) returns 1.5 instead of 2.\n")
    result = stop.value.result
    assert result.exit_status == "interrupted"
    turn = result.turns[-1]
    assert turn.finish_reason == "interrupted" and turn.reply_tokens == CtrlCAfter.n
    assert turn.reply == tiny.tokenizer.decode(session.history[-CtrlCAfter.n :])
    assert turn.cache_entries and turn.logical_length == session.logical_length
    # The transcript still matches the stream token for token, partial reply included.
    assert result.messages[-1] == {"role": "assistant", "content": turn.reply}
    assert tiny.tokenizer.decode(session.history) == ChatMLRenderer.transcript(result.messages)


def test_ctrl_c_before_any_reply_token_adds_no_empty_reply(tiny, fake_env):
    class AtOnce(CtrlCAfter):
        def _generate(self, max_new_tokens):
            raise KeyboardInterrupt

    session = tiny.session(CacheConfig(policy="full"))
    agent = AtOnce(session, fake_env, tiny.tokenizer, AgentConfig(max_steps=3, max_new_tokens=40))
    with pytest.raises(EpisodeInterrupted) as stop:
        agent.run("fix it\n")
    result = stop.value.result
    assert result.turns[-1].reply == "" and result.messages[-1]["role"] == "user"
