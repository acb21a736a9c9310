"""history=drop-thinking on a real session (tiny-random-qwen3): the agent forgets each past reply's
<think> span, and the cache stays exact. Persistent mode: every logit equals full attention with
the evicted and the forgotten entries masked out (the oracle), and no layer holds a forgotten
position. Reprefill mode: the history is the stream without those tokens."""

from __future__ import annotations

import pytest

from kvagent.agent import AgentConfig, run_episode
from kvagent.runtime import CacheConfig, Engine
from kvagent.runtime.oracle import check_session_against_oracle, trace
from kvagent.testing import Generated
from tests.helpers import call

from .test_r2egym_profile import Env

TOL = 1e-4
REPLIES = [
    "<think>\nLook at the code first.\n</think>\n\nViewing.\n" + call("execute_bash", cmd="ls"),
    "<think>Now run it.</think>\n" + call("execute_bash", cmd="python x.py"),
    "<think>\nDone.\n</think>\n\n" + call("finish", command="submit"),
]


class ForcedSession:
    """A real Session whose replies are fixed text fed with teacher_force, as if sampled."""

    def __init__(self, session, tokenizer, replies):
        self.session, self.tokenizer, self.replies = session, tokenizer, list(replies)

    def __getattr__(self, name):  # logical_length, stats, append, forget, history, ...
        return getattr(self.session, name)

    def generate(self, max_new_tokens, sampling=None, stop=(), on_token=None):
        ids = self.tokenizer.encode(self.replies.pop(0), add_special_tokens=False)
        ids = [*ids, self.tokenizer.convert_tokens_to_ids("<|im_end|>")][:max_new_tokens]
        self.session.teacher_force(ids)
        return Generated(ids, self.tokenizer.decode(ids), "eos")


@pytest.fixture(scope="module")
def tiny():
    return Engine.load("tiny-random-qwen3", device="cpu")


@pytest.fixture
def prompts(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text("system_prompt: You fix bugs.\ninstance_prompt: 'Fix: {problem_statement}'\n")
    return str(p)


def episode(tiny, cache, prompts):
    session = tiny.session(cache)
    forced = ForcedSession(session, tiny.tokenizer, REPLIES)
    config = AgentConfig(scaffold="r2egym", prompts=prompts, history="drop-thinking")
    with trace(session) as records:
        result = run_episode(forced, Env(), "x.py crashes", config, tokenizer=tiny.tokenizer)
    assert result.exit_status == "submitted", result.error
    return session, records, result


@pytest.mark.parametrize("policy", ["full", "random"])
def test_persistent_drop_thinking_is_exact(tiny, prompts, policy):
    budget = None if policy == "full" else 96
    cache = CacheConfig(policy=policy, budget=budget, buffer=16, protect="sink", seed=2)
    session, records, result = episode(tiny, cache, prompts)
    dropped = [t.thinking_forgotten for t in result.turns]
    assert dropped[0] > 5 and dropped[1] > 3 and dropped[2] == 0  # the last reply is never followed
    # forgotten = the tokens of "<think>...</think>" (+ newlines) at the start of replies 1 and 2
    starts = [result.prompt_tokens]
    first = list(range(starts[0], starts[0] + dropped[0]))
    assert (
        tiny.tokenizer.decode([session.history[p] for p in first])
        == "<think>\nLook at the code first.\n</think>\n\n"
    )
    held = {int(p) for layer in session.kept_positions() for p in layer.flatten().tolist()}
    assert not held & set(first)
    assert session.logical_length == len(session.history)  # positions kept: the stream is whole
    assert check_session_against_oracle(session, records) < TOL


def test_reprefill_drop_thinking_leaves_the_thinking_out_of_the_history(tiny, prompts):
    cache = CacheConfig(policy="random", budget=96, buffer=16, protect="sink", mode="reprefill", seed=2)
    session, _, result = episode(tiny, cache, prompts)
    text = tiny.tokenizer.decode(session.history)
    assert "Look at the code first." not in text and "Now run it." not in text
    assert "<think>\nDone.\n</think>" in text  # the last reply keeps its thinking
    assert "Viewing.\n<function=execute_bash>" in text
    kept = sum(t.reply_tokens + t.observation_tokens for t in result.turns) + result.prompt_tokens
    assert session.logical_length == kept - sum(t.thinking_forgotten for t in result.turns)
