"""The agent on the real model path: a real Engine/Session (tiny random Qwen3 with the real Qwen3
tokenizer; SmolLM2 when slow), a real sandbox (local; Docker when slow), eviction rounds under a small
budget, persistent and reprefill modes. The models do not solve anything; what is checked is the
contract: the token stream stays append-only and equal to the rendered messages after every turn, every
turn is recorded with its cache stats, and eviction really happened."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvagent.agent import Agent, AgentConfig, ChatMLRenderer, load_trajectory, solve_episode
from kvagent.agent.chat import ChatAgent
from kvagent.runtime import CacheConfig, Engine
from kvagent.sandbox import open_sandbox

ISSUE = "mean([1, 2, 3]) returns 1.5 instead of 2.\n"
# protect=sink keeps budgets far below the ~1.2k-token prompt, so rounds fire from the first append.
CASES = [
    ("random", "persistent", 256),
    ("nexus", "reprefill", 256),  # block policy: budget a multiple of 32
    ("snapkv", "persistent", 192),
    ("snapkv", "reprefill", 192),
]


@pytest.fixture(scope="module")
def tiny():
    return Engine.load("tiny-random-qwen3", device="cpu")


@pytest.fixture(scope="module")
def smollm2():
    return Engine.load("smollm2", device="cpu")


def cache(policy, mode, budget):
    return CacheConfig(policy=policy, budget=budget, buffer=32, protect="sink", mode=mode, seed=1)


def checked_agent(engine, session, env, config, seen):
    """An Agent whose every event re-checks the stream against the rendered messages."""
    tok = engine.tokenizer

    def on_event(event):
        assert session.logical_length == len(session.history) == event.logical_length
        assert tok.decode(session.history) == ChatMLRenderer.transcript(agent.messages)
        assert session.history[: len(seen)] == seen  # nothing fed earlier ever changes
        seen[:] = session.history

    agent = Agent(session, env, tok, config, on_event)
    return agent


def run_checked(engine, env, cfg, steps=3, new_tokens=32):
    session = engine.session(cfg)
    seen: list[int] = []
    agent = checked_agent(engine, session, env, AgentConfig(max_steps=steps, max_new_tokens=new_tokens), seen)
    result = agent.run(ISSUE)
    assert result.exit_status in ("step_limit", "submitted"), result.error
    assert engine.tokenizer.decode(session.history) == ChatMLRenderer.transcript(result.messages)
    assert result.logical_length == session.logical_length == len(session.history)
    assert [t.step for t in result.turns] == list(range(1, result.steps + 1))
    bound = cfg.budget + cfg.buffer + cfg.recent_buffer
    for turn in result.turns:
        assert turn.cache is not None and turn.cache["logical_length"] == turn.logical_length
        assert 1 <= turn.reply_tokens <= new_tokens and turn.observation
        # Never more than K + r entries in any layer between rounds, K + 2r under recent-buffer (its
        # newest r are outside the K scored ones).
        assert turn.cache_entries <= bound
    stats = session.stats
    assert stats.rounds > 0 and stats.evicted > 0
    assert max(stats.entries) <= bound
    return result, session


@pytest.mark.parametrize(("policy", "mode", "budget"), CASES)
def test_tiny_qwen3_in_the_local_sandbox(tiny, policy, mode, budget, repo):
    with open_sandbox("local", repo=repo) as sb:
        result, session = run_checked(tiny, sb, cache(policy, mode, budget))
        # The model is random, so its replies are rarely valid calls: each one still gets an observation.
        assert all(t.call or t.call_error for t in result.turns)
    if mode == "reprefill":  # every append re-prefilled the whole history
        assert session.stats.prefill_tokens > session.logical_length


def test_solve_episode_trajectory_with_a_real_session(tiny, repo, tmp_path):
    cfg = cache("random", "persistent", 256)
    with open_sandbox("local", repo=repo) as sb:
        result = solve_episode(
            tiny,
            sb,
            ISSUE,
            cache_config=cfg,
            config=AgentConfig(max_steps=2, max_new_tokens=24),
            trajectory_path=tmp_path / "t.traj.json",
        )
    traj = load_trajectory(tmp_path / "t.traj.json")
    assert traj["steps"] == 2 == len(traj["turns"]) and traj["exit_status"] == "step_limit"
    assert traj["meta"]["cache_config"]["policy"] == "random" and traj["meta"]["model"] == "tiny-random-qwen3"
    assert all(t["cache"]["rounds"] > 0 and t["cache"]["entries"] for t in traj["turns"])
    assert traj["messages"] == result.messages


@pytest.mark.parametrize("mode", ["persistent", "reprefill"])
def test_chat_on_the_real_session_with_an_interrupted_reply(tiny, repo, mode):
    """Two requests on one stream, the second interrupted after a few tokens, then a third."""
    session = tiny.session(cache("snapkv", mode, 192))
    tok = tiny.tokenizer
    shown = []
    stop_after = [0]

    def show(text):  # the reply as it streams
        shown.append(text)
        if stop_after[0] and len(shown) == stop_after[0]:
            chat.interrupt()  # what the terminal's SIGINT handler does

    with open_sandbox("local", repo=repo) as sb:
        chat = ChatAgent(session, sb, tok, AgentConfig(max_steps=2, max_new_tokens=24), on_text=show)
        assert chat.ask("Explain calc/__init__.py.") in ("step_limit", "submitted")
        lengths = [session.logical_length]
        shown.clear()
        stop_after[0] = 5
        assert chat.ask("Now fix the bug.") == "interrupted"
        interrupted = chat.turns[-1]
        assert interrupted.finish_reason == "interrupted" and interrupted.reply_tokens <= 6
        lengths.append(session.logical_length)
        stop_after[0] = 0
        assert chat.ask("Go on.") in ("step_limit", "submitted")
        lengths.append(session.logical_length)
    assert lengths == sorted(lengths) and len(set(lengths)) == 3
    assert tok.decode(session.history) == ChatMLRenderer.transcript(chat.messages)
    assert session.logical_length == len(session.history)
    users = [m["content"] for m in chat.messages if m["role"] == "user"]
    assert any(u.startswith("The user interrupted your reply.\n\nGo on.") for u in users)
    assert session.stats.rounds > 0


@pytest.mark.slow
def test_smollm2_in_the_local_sandbox(smollm2, repo):
    # One case only: a 135M model on a shared 2-core CPU prefills the ~1.4k-token prompt in about a
    # minute; reprefill and the other policies are covered on the tiny model above.
    with open_sandbox("local", repo=repo) as sb:
        run_checked(smollm2, sb, cache("random", "persistent", 256), steps=2, new_tokens=24)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["persistent", "reprefill"])
def test_tiny_qwen3_in_the_docker_sandbox(tiny, base_image, repo: Path, mode):
    with open_sandbox("docker", image=base_image, repo=repo) as sb:
        assert sb.workdir == "/testbed"
        result, _ = run_checked(tiny, sb, cache("snapkv", mode, 192), steps=2, new_tokens=24)
        assert "/testbed" in result.messages[1]["content"]  # the prompt names the container's path
        assert sb.run("git status --porcelain").output.strip() == ""  # random replies changed nothing
