import subprocess
import sys

import pytest

from kvagent.agent import (
    FINISHED,
    Agent,
    AgentConfig,
    ChatMLRenderer,
    load_trajectory,
    run_episode,
    solve_episode,
    write_trajectory,
)
from kvagent.errors import KvagentError

ISSUE = "mean([1, 2, 3]) returns 1.5 instead of 2.\n"


def call(name, **params):
    body = "".join(f"  <parameter={k}>{v}</parameter>\n" for k, v in params.items())
    return f"<function={name}>\n{body}</function>"


SOLVE = [
    "<think>\nFirst, look at the package source.\n</think>\nLet me view the module.\n\n"
    + call("file_editor", command="view", path="/testbed/calc/__init__.py"),
    "<think>The denominator has a stray + 1. Reproduce with the tests.</think>\n"
    + call("execute_bash", cmd="cd /testbed && python -m pytest -q -p no:cacheprovider tests"),
    "The test fails as the issue says. Fix the denominator.\n\n"
    + call(
        "file_editor",
        command="str_replace",
        path="/testbed/calc/__init__.py",
        old_str="\n    total = sum(values)\n    return total / (len(values) + 1)\n",
        new_str="\n    total = sum(values)\n    return total / len(values)\n",
    ),
    call("execute_bash", cmd="cd /testbed && python -m pytest -q -p no:cacheprovider tests"),
    "<think>Fixed and verified.</think>\n"
    + call("finish", command="submit", result="Divide by len(values)."),
]


def check_stream(agent, session, tokenizer):
    assert session.logical_length == len(session.history)
    assert tokenizer.decode(session.history) == ChatMLRenderer.transcript(agent.messages)


def test_scripted_model_fixes_the_bug(scripted, fake_env, fresh_repo, tokenizer, tmp_path):
    session = scripted(SOLVE, budget=256)
    events = []

    def on_event(event):
        events.append(event)
        check_stream(agent, session, tokenizer)  # append-only stream == rendered messages, every turn

    agent = Agent(session, fake_env, tokenizer, AgentConfig(), on_event)
    result = agent.run(ISSUE)
    assert result.exit_status == "submitted", result.error
    check_stream(agent, session, tokenizer)

    assert [t.call["name"] for t in result.turns] == [
        "file_editor",
        "execute_bash",
        "file_editor",
        "execute_bash",
        "finish",
    ]
    assert "return total / (len(values) + 1)" in result.turns[0].observation
    assert "1 failed" in result.turns[1].observation and result.turns[1].observation.startswith(
        "Exit code: 1"
    )
    assert "1 passed" in result.turns[3].observation and result.turns[3].observation.startswith(
        "Exit code: 0"
    )
    assert result.turns[4].observation == FINISHED and not result.turns[4].fed
    assert all(t.fed for t in result.turns[:4])

    # The patch, applied to an untouched copy, makes the test pass.
    assert "-    return total / (len(values) + 1)\n+    return total / len(values)" in result.patch
    fresh = fresh_repo()
    subprocess.run(["git", "-C", str(fresh), "apply", "-"], input=result.patch, text=True, check=True)
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], cwd=fresh,
                           capture_output=True, text=True)  # fmt: skip
    assert tests.returncode == 0, tests.stdout

    # Messages: system, user, then assistant/user pairs; each observation carries the step budget.
    roles = [m["role"] for m in result.messages]
    assert roles == ["system", "user"] + ["assistant", "user"] * 4 + ["assistant"]
    assert result.messages[1]["content"].endswith("Steps Remaining: 100")
    for step, m in enumerate(result.messages[3::2][:4], 1):
        assert m["content"].endswith(f"Steps Remaining: {100 - step}")
    assert result.messages[2]["content"].endswith("</function>")

    # Sampling contract, stop string, one append per prompt / observation.
    assert all(c["stop"] == ["</function>"] and c["sampling"].temperature == 1.0 for c in session.calls)
    assert session.appends == [result.prompt_tokens] + [t.observation_tokens for t in result.turns[:4]]

    # Per-turn bookkeeping grows monotonically and reflects the (fake) cache budget.
    lengths = [t.logical_length for t in result.turns]
    assert lengths == sorted(lengths) and lengths[-1] == session.logical_length == result.logical_length
    assert all(t.cache_entries == min(t.logical_length, 256) for t in result.turns)
    assert [e.kind for e in events] == ["start"] + ["reply", "observation"] * 4 + ["reply", "end"]
    assert events[-1].exit_status == "submitted" and events[-1].step == 5

    path = write_trajectory(tmp_path / "runs" / "calc.traj.json", result, {"instance_id": "calc-1"})
    traj = load_trajectory(path)
    assert traj["exit_status"] == "submitted" and traj["steps"] == 5 and traj["patch"] == result.patch
    assert traj["meta"] == {"instance_id": "calc-1"}
    assert traj["config"]["max_steps"] == 100 and traj["config"]["context_limit"] == 65536
    assert traj["messages"] == result.messages
    assert [t["step"] for t in traj["turns"]] == [1, 2, 3, 4, 5]
    assert traj["turns"][1]["call"] == {
        "name": "execute_bash",
        "params": {"cmd": SOLVE[1].split("<parameter=cmd>")[1].split("<")[0]},
    }
    assert all(t["cache"]["logical_length"] == t["logical_length"] for t in traj["turns"])
    assert all(t["generate_s"] >= 0 and t["tool_s"] >= 0 for t in traj["turns"])


def test_a_reply_without_a_call_gets_an_error_and_the_episode_goes_on(scripted, fake_env, tokenizer):
    session = scripted(["<think>Hmm.</think>\nI think the bug is in calc.", call("finish", command="submit")])
    result = run_episode(session, fake_env, ISSUE, tokenizer=tokenizer)
    assert result.exit_status == "submitted"
    first = result.turns[0]
    assert first.finish_reason == "eos" and first.call is None and "no function call" in first.call_error
    assert result.messages[3]["content"].startswith("ERROR: your reply contains no function call.")
    assert "You must call exactly one function" in result.messages[3]["content"]
    # The reply ended on <|im_end|> (EOS): the observation must not close the turn a second time.
    assert "<|im_end|><|im_end|>" not in tokenizer.decode(session.history)
    assert tokenizer.decode(session.history) == ChatMLRenderer.transcript(result.messages)
    assert fake_env.calls == [("finish", {"command": "submit"})]


def test_step_limit_and_submit_warning(scripted, fake_env, tokenizer):
    session = scripted([call("execute_bash", cmd="echo hi")] * 3)
    config = AgentConfig(max_steps=3, soft_step_limit=1, urge_remaining=0)
    result = run_episode(session, fake_env, ISSUE, config, tokenizer=tokenizer)
    assert result.exit_status == "step_limit" and result.steps == 3
    assert len(fake_env.calls) == 3  # the last call still runs; its output is recorded, not fed
    assert "hi" in result.turns[-1].observation and not result.turns[-1].fed
    users = [m["content"] for m in result.messages if m["role"] == "user"]
    assert "Submit your answer now" not in users[0] and "Submit your answer now" not in users[1]
    assert users[2].endswith(
        "Steps Remaining: 1\nYou are close to the step limit. Submit your answer now by calling `finish`."
    )


def test_context_limit_while_generating(scripted, fake_env, tokenizer):
    probe = run_episode(scripted([call("finish", command="submit")]), fake_env, ISSUE, tokenizer=tokenizer)
    fake_env.calls.clear()
    session = scripted([call("execute_bash", cmd="echo " + "word " * 400)])
    config = AgentConfig(context_limit=probe.prompt_tokens + 100)
    result = run_episode(session, fake_env, ISSUE, config, tokenizer=tokenizer)
    assert result.exit_status == "context_limit", result.error
    assert session.logical_length == config.context_limit
    assert result.turns[0].finish_reason == "length" and fake_env.calls == []
    assert tokenizer.decode(session.history) == ChatMLRenderer.transcript(result.messages)


def test_context_limit_on_an_observation(scripted, fake_env, tokenizer):
    reply = call("execute_bash", cmd="seq 1 500")
    probe = run_episode(
        scripted([reply, call("finish", command="submit")]), fake_env, ISSUE, tokenizer=tokenizer
    )
    used = probe.prompt_tokens + probe.turns[0].reply_tokens
    assert probe.turns[0].observation_tokens > 20
    session = scripted([reply])
    result = run_episode(session, fake_env, ISSUE, AgentConfig(context_limit=used + 20), tokenizer=tokenizer)
    assert result.exit_status == "context_limit"
    assert result.turns[0].observation and not result.turns[0].fed
    assert session.logical_length == used
    assert tokenizer.decode(session.history) == ChatMLRenderer.transcript(result.messages)


def test_prompt_longer_than_the_context_limit(scripted, fake_env, tokenizer):
    session = scripted([])
    result = run_episode(session, fake_env, ISSUE, AgentConfig(context_limit=50), tokenizer=tokenizer)
    assert (result.exit_status, result.steps, result.messages, session.history) == (
        "context_limit",
        0,
        [],
        [],
    )


def test_environment_failure_ends_with_error_and_keeps_the_patch(scripted, fake_env, tokenizer):
    fake_env.fail_on = "execute_bash"
    replies = [
        call("file_editor", command="create", path="/testbed/notes.txt", file_text="hello"),
        call("execute_bash", cmd="ls"),
    ]
    result = run_episode(scripted(replies), fake_env, ISSUE, tokenizer=tokenizer)
    assert result.exit_status == "error"
    assert result.error == "RuntimeError: sandbox container died"
    assert "+hello" in result.patch and result.steps == 2


def test_run_episode_wants_a_fresh_session(scripted, fake_env, tokenizer):
    session = scripted([])
    session.append([1, 2, 3])
    with pytest.raises(KvagentError, match="fresh session"):
        run_episode(session, fake_env, ISSUE, tokenizer=tokenizer)


def test_solve_episode_opens_a_session_and_writes_the_trajectory(scripted, fake_env, tokenizer, tmp_path):
    class CacheCfg:
        def to_dict(self):
            return {"policy": "random", "budget": 512}

    class FakeEngine:
        name = "scripted-qwen3"

        def __init__(self):
            self.tokenizer = tokenizer
            self.configs = []

        def session(self, config):
            self.configs.append(config)
            return scripted([call("finish", command="submit")])

    engine, cfg = FakeEngine(), CacheCfg()
    path = tmp_path / "out" / "x.traj.json"
    result = solve_episode(engine, fake_env, ISSUE, cache_config=cfg, trajectory_path=path, meta={"seed": 3})
    assert result.exit_status == "submitted" and engine.configs == [cfg]
    traj = load_trajectory(path)
    assert traj["meta"] == {
        "cache_config": {"policy": "random", "budget": 512},
        "model": "scripted-qwen3",
        "seed": 3,
    }
