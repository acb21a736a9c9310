"""history=...+mask-observations on a real session (tiny-random-qwen3): only the newest M observations
stay whole. Persistent mode: the older ones' content positions are gone from every layer and head,
the rest untouched (every logit equals full attention over the remaining positions: the oracle).
Reprefill mode: the re-sent history holds each older observation as the placeholder line, byte for
byte."""

from __future__ import annotations

import pytest

from kvagent.agent import Agent, AgentConfig
from kvagent.agent.history import PLACEHOLDER, History, newly_masked, parse_history, placeholder
from kvagent.errors import ConfigError
from kvagent.runtime import CacheConfig, Engine
from kvagent.runtime.oracle import check_session_against_oracle, trace
from tests.helpers import call

from .test_drop_thinking import ForcedSession
from .test_r2egym_profile import Env, Res

TOL = 1e-4
OUTPUTS = ["alpha one\nalpha two\nalpha three\n", "beta\n", "gamma one\ngamma two\n", "delta\n"]
REPLIES = [
    "<think>Look.</think>\n" + call("execute_bash", cmd="ls"),
    "<think>Run.</think>\n" + call("execute_bash", cmd="python x.py"),
    call("execute_bash", cmd="cat x.py"),
    call("execute_bash", cmd="cat y.py"),
    call("finish", command="submit"),
]


class SeqEnv(Env):
    """Each tool call answers with the next of OUTPUTS."""

    def run_tool(self, name, params, timeout=90):
        n = sum(c[0] != "install" for c in self.calls)
        self.calls.append((name, dict(params)))
        return Res(0, OUTPUTS[n % len(OUTPUTS)])


@pytest.fixture(scope="module")
def tiny():
    return Engine.load("tiny-random-qwen3", device="cpu")


@pytest.fixture
def prompts(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text("system_prompt: You fix bugs.\ninstance_prompt: 'Fix: {problem_statement}'\n")
    return str(p)


def episode(tiny, cache, prompts, history):
    session = tiny.session(cache)
    forced = ForcedSession(session, tiny.tokenizer, REPLIES)
    config = AgentConfig(scaffold="r2egym", prompts=prompts, history=history)
    agent = Agent(forced, SeqEnv(), tiny.tokenizer, config)
    with trace(session) as records:
        result = agent.run("x.py crashes")
    assert result.exit_status == "submitted", result.error
    return session, records, result, agent


def test_parse_history_spellings_and_errors():
    assert parse_history("mask-observations") == History("keep-thinking", 10)  # the paper's M
    assert parse_history("drop-thinking+mask-observations=3") == History("drop-thinking", 3)
    assert parse_history("drop-thinking") == History("drop-thinking", None)
    assert parse_history("mask-observations=3").spell() == "mask-observations=3"
    for bad in ("mask-observations=0", "mask-observations=x", "drop-thinking+keep-thinking", "masks"):
        with pytest.raises(ConfigError, match="history"):
            parse_history(bad)
    with pytest.raises(ConfigError, match="history"):
        AgentConfig(history="mask-observations=0")


def test_the_placeholder_line_and_what_is_masked_when():
    assert PLACEHOLDER == "Old environment output: ({n} lines omitted)"
    assert placeholder("a\nb\nc\n") == "Old environment output: (3 lines omitted)"
    assert placeholder("") == "Old environment output: (0 lines omitted)"
    # before observation 2 (0-based) is fed with M=2, observation 0 leaves; nothing with M=3
    assert list(newly_masked(2, 2, 0)) == [0]
    assert list(newly_masked(2, 3, 0)) == []
    assert list(newly_masked(4, 2, 1)) == [1, 2]


@pytest.mark.parametrize("policy", ["full", "random", "segments"])
def test_persistent_masking_forgets_old_observations_exactly(tiny, prompts, policy):
    budget = None if policy == "full" else 96
    cache = CacheConfig(policy=policy, budget=budget, buffer=16, protect="sink", seed=2)
    session, records, result, agent = episode(tiny, cache, prompts, "mask-observations=2")
    spans = agent.mask.spans
    masked = [t.observations_masked for t in result.turns]
    # observations are fed after turns 1-4; the 3rd and 4th each push one out of the newest 2
    assert masked[:2] == [0, 0] and masked[2] > 0 and masked[3] > 0 and masked[4] == 0
    spans = agent.mask.spans
    assert len(spans) == 4 and agent.mask.masked == 2
    tok = tiny.tokenizer
    for (a, b, text), out in zip(spans, OUTPUTS, strict=True):
        assert out in text and tok.decode(session.history[a:b]) == text  # the content, framing outside
    gone = set(range(spans[0][0], spans[0][1])) | set(range(spans[1][0], spans[1][1]))
    # forget counts positions some (layer, head) still held: all of them with the full cache
    assert masked[2] + masked[3] == len(gone) if policy == "full" else 0 < masked[2] + masked[3] <= len(gone)
    assert session.logical_length == len(session.history)  # positions kept: the stream is whole
    held = {int(p) for layer in session.kept_positions() for p in layer.flatten().tolist()}
    assert not held & gone
    if policy == "full":  # the rest untouched: every other position is held by every layer
        for layer in session.kept_positions():
            for head in layer[0]:
                assert {int(p) for p in head.tolist() if p >= 0} == set(range(session.logical_length)) - gone
    assert check_session_against_oracle(session, records) < TOL
    # the agent marked each reply and each observation's content as a segment (segment policies)
    marks = set(session.evictor.segments)
    assert {a for a, _, _ in spans} <= marks and result.prompt_tokens in marks


def test_reprefill_masking_rerenders_the_placeholder_byte_for_byte(tiny, prompts):
    cache = CacheConfig(policy="full", mode="reprefill")
    session, _, result, agent = episode(tiny, cache, prompts, "drop-thinking+mask-observations=2")
    text = tiny.tokenizer.decode(session.history)
    first, second = agent.mask.spans[0][2], agent.mask.spans[1][2]
    assert "alpha" not in text and "beta" not in text  # both pushed out of the newest 2
    assert "gamma one\ngamma two\n" in text and "delta\n" in text
    assert "Look." not in text and "Run." not in text  # composed with drop-thinking
    n_a, n_b = len(first.splitlines()), len(second.splitlines())
    line_a = f"<|im_start|>user\nOld environment output: ({n_a} lines omitted)<|im_end|>\n"
    line_b = f"<|im_start|>user\nOld environment output: ({n_b} lines omitted)<|im_end|>\n"
    assert n_a > n_b >= 1 and text.count(line_a) == 1 and text.count(line_b) == 1
    assert text.index(line_a) < text.index(line_b) < text.index("gamma one")
    assert [t.observations_masked > 0 for t in result.turns] == [False, False, True, True, False]
    # The segment marks moved with the re-sent history (and drop-thinking's forgets): each names
    # where a reply or an observation's content (placeholder or whole) starts in it now.
    head = tiny.tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)
    h = session.history
    replies = {i + len(head) for i in range(len(h)) if h[i : i + len(head)] == head}
    observations = {start for start, _, _ in agent.mask.spans}
    assert len(replies) == 5 and len(observations) == 4
    assert set(session.segment_starts) == replies | observations
    assert all(
        tiny.tokenizer.decode(h[a : a + 4]).startswith("Old environment") for a in sorted(observations)[:2]
    )
