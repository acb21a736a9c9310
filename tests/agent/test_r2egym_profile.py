"""The `r2egym` protocol profile and `--prompts` files, with a scripted model: what the model reads
(prompts verbatim, the countdown and notices), how its replies are read (R2E-Gym's parsing), when
the episode ends, and drop-thinking's forget calls."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from kvagent.agent import Agent, AgentConfig, run_episode
from kvagent.agent.prompt_file import load_prompt_file
from kvagent.agent.r2egym import (
    parse_action,
    runtime_output,
    steps_line,
    task_instruction,
    unknown_tool_observation,
)
from kvagent.agent.thinking import thinking_offsets
from kvagent.errors import ConfigError
from tests.helpers import call

SYSTEM = "You are a test agent.\nTools: file_editor, execute_bash, search, finish.\n  Indented {not a placeholder}\n"
PROMPTS = f"""\
system_prompt: |-
{"".join("  " + line + chr(10) for line in SYSTEM.splitlines())}
instance_prompt: |-
  Repository in /testbed.
  <github_issue>
  {{problem_statement}}
  </github_issue>
  Literal {{{{braces}}}} stay.
final_steps_notice: SUBMIT NOW.
no_call_message: Use a function call.
command_files:
  - ./tools/finish.py
llm_name: gpt-4o
"""


@dataclass
class Res:
    exit_code: int
    output: str
    timed_out: bool = False


@dataclass
class Env:
    """Answers every tool with exit code 0 and a fixed output; records the calls."""

    output: str = "ok\n"
    workdir: str = "/testbed"
    calls: list = field(default_factory=list)

    def run_tool(self, name, params, timeout=90):
        self.calls.append((name, dict(params)))
        return Res(0, self.output)

    def install_commands(self, scripts):  # --r2egym: the checkout's tools
        self.calls.append(("install", sorted(scripts)))

    def run_command(self, cmd, timeout=90):
        self.calls.append(("command", cmd))
        return Res(0, self.output)

    def diff(self):
        return ""


@pytest.fixture
def prompts(tmp_path):
    p = tmp_path / "prompts.yaml"
    p.write_text(PROMPTS)
    return str(p)


def r2e(prompts=None, **kw):
    return AgentConfig(scaffold="r2egym", prompts=prompts, history=kw.pop("history", "keep-thinking"), **kw)


# ------------------------------------------------------------------------------------- parsing
def test_parse_takes_first_block_strips_and_keeps_last_duplicate():
    reply = (
        "thinking <function=file_editor> mentioned\n"
        + call("execute_bash", cmd=" ls ")
        + call("search", search_term="x")
    )
    a = parse_action(reply)
    assert a.name == "file_editor"  # from the first <function= to the first </function>
    assert a.params == {"cmd": "ls"}
    dup = parse_action(
        "<function= execute_bash >\n<parameter=cmd>a</parameter><parameter= cmd >b</parameter></function>"
    )
    assert (dup.name, dup.params) == ("execute_bash", {"cmd": "b"})
    assert parse_action("no call here").name == ""
    assert parse_action("<function=finish>unclosed").name == ""


def test_observation_texts():
    assert unknown_tool_observation("grep") == "Execution output of [grep]:\n"
    assert unknown_tool_observation("bash") == "Exit code: -1\nExecution output of [bash]:\n"
    assert runtime_output(Res(0, "\x1b[31mred\x1b[0m\r\n"), 90) == ("red\n", "0")
    assert runtime_output(Res(2, "\x1b[31mred\x1b[0m"), 90) == ("\x1b[31mred\x1b[0m", "Error: Exit code 2")
    assert runtime_output(Res(124, "partial"), 90) == ("The command took too long to execute (>90s)", "-1")
    assert runtime_output(Res(-9, "", timed_out=True), 2.5) == (
        "The command took too long to execute (>2.5s)",
        "-1",
    )


def test_task_instruction_and_steps_line():
    assert task_instruction("pre [ISSUE] a [/ISSUE] mid [ISSUE] b [/ISSUE]") == " a [/ISSUE] mid [ISSUE] b "
    assert task_instruction("plain") == "plain"
    assert steps_line(0, 40, "Steps Remaining: {remaining}", "X") == "Steps Remaining: 40"
    assert steps_line(39, 40, "Steps Remaining: {remaining}", "X") == "Steps Remaining: 1"
    assert steps_line(40, 40, "Steps Remaining: {remaining}", "X") == "X"


# ------------------------------------------------------------------------------------- prompt files
def test_prompt_file_verbatim_in_the_stream(scripted, tokenizer, prompts):
    session = scripted([call("finish", command="submit")])
    result = run_episode(session, Env(), "[ISSUE]\nThe bug.\n[/ISSUE]", r2e(prompts), tokenizer=tokenizer)
    system, user = result.messages[0], result.messages[1]
    assert system == {"role": "system", "content": SYSTEM.rstrip("\n")}
    assert user["content"] == (
        "Repository in /testbed.\n<github_issue>\n\nThe bug.\n\n</github_issue>\nLiteral {braces} stay.\nSteps Remaining: 40"
    )
    assert result.exit_status == "submitted" and result.config.prompts == prompts


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("system_prompt: a\n", "system_prompt and instance_prompt are both required"),
        ("system_prompt: a\ninstance_prompt: no placeholder\n", "no {problem_statement} placeholder"),
        ("system_prompt: a\ninstance_prompt: '{problem_statement} {gt_patch}'\n", "placeholder 'gt_patch'"),
        (
            "system_prompt: a\ninstance_prompt: '{problem_statement}'\nsystem_promt: b\n",
            "unknown key 'system_promt'",
        ),
        ("system_prompt: [a\n", "not valid YAML"),
        ("- a\n", "must hold a mapping"),
        ("system_prompt: a\ninstance_prompt: '{problem_statement}'\nsteps_remaining: Left\n", "{remaining}"),
    ],
)
def test_bad_prompt_files_fail_with_one_line(tmp_path, text, needle):
    p = tmp_path / "p.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError, match="prompts") as e:
        AgentConfig(prompts=str(p))
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_missing_prompt_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_prompt_file(tmp_path / "nope.yaml")


def test_prompt_file_under_the_kvagent_profile_keeps_kvagent_notices(scripted, tokenizer, prompts):
    session = scripted(["no call", call("finish", command="submit")])
    result = run_episode(session, Env(), "bug", AgentConfig(prompts=prompts), tokenizer=tokenizer)
    assert result.messages[0]["content"] == SYSTEM.rstrip("\n")
    assert result.messages[1]["content"].endswith("Literal {braces} stay.\n\nSteps Remaining: 100")
    assert result.messages[3]["content"] == "Use a function call.\n\nSteps Remaining: 99"
    assert session.calls[0]["stop"] == ["</function>"]


# ------------------------------------------------------------------------------------- the loop
def test_r2egym_loop_tools_notices_and_generation(scripted, tokenizer, prompts):
    replies = [
        "<think>look</think>\n" + call("execute_bash", cmd="ls"),
        "oops, no call",
        call("grep", pattern="x"),
        call("execute_bash", cmd="a", command="b") + " trailing text",
        call("finish", command="submit"),
    ]
    env, session = Env(), scripted(replies)
    starts, generate = [], session.generate
    session.generate = lambda *a, **k: starts.append(session.logical_length) or generate(*a, **k)
    result = run_episode(session, env, "bug", r2e(prompts, soft_step_limit=3), tokenizer=tokenizer)
    assert result.exit_status == "submitted" and result.steps == 5
    # only known tools run, as the r2egym scripts; parameters pass unvalidated
    assert env.calls == [
        ("r2egym/execute_bash", {"cmd": "ls"}),
        ("r2egym/execute_bash", {"cmd": "a", "command": "b"}),
        ("r2egym/finish", {"command": "submit"}),
    ]
    users = [m["content"] for m in result.messages if m["role"] == "user"]
    assert users[1] == "Exit code: 0\nExecution output of [execute_bash]:\nok\n\nSteps Remaining: 2"
    assert users[2] == "Use a function call.\nSteps Remaining: 1"
    assert users[3] == "Execution output of [grep]:\n\nSUBMIT NOW."
    assert users[4].endswith("\nSUBMIT NOW.")
    assert result.turns[2].call == {"name": "grep", "params": {"pattern": "x"}}
    assert result.turns[2].call_error == "unknown function 'grep'"
    # no stop strings, no per-reply cap: each reply may use what is left of the context
    for c, start in zip(session.calls, starts, strict=True):
        assert c["stop"] == [] and c["max_new_tokens"] == 65_536 - start
    assert "trailing text" in result.turns[3].reply  # generation did not stop at </function>


def test_any_finish_or_submit_name_ends_the_episode(scripted, tokenizer):
    env = Env()
    result = run_episode(scripted([call("submit_patch")]), env, "bug", r2e(), tokenizer=tokenizer)
    assert result.exit_status == "submitted" and env.calls == []


def test_hard_step_limit(scripted, tokenizer):
    session = scripted([call("execute_bash", cmd="ls")] * 3)
    result = run_episode(session, Env(), "bug", r2e(max_steps=3, soft_step_limit=1), tokenizer=tokenizer)
    assert result.exit_status == "step_limit" and result.steps == 3
    users = [m["content"] for m in result.messages if m["role"] == "user"]
    assert users[0].endswith("\nSteps Remaining: 1")
    assert users[1].endswith("You are close to the step limit. Submit your answer now by calling `finish`.")


def test_token_rule_runs_the_tool_then_stops(scripted, tokenizer):
    long_reply = "word " * 400 + call("execute_bash", cmd="ls")
    env, session = Env(), scripted([long_reply])
    probe = scripted([])
    Agent(probe, env, tokenizer, r2e()).start("bug")
    limit = probe.logical_length + 50  # the reply fills the context
    result = run_episode(session, env, "bug", r2e(context_limit=limit), tokenizer=tokenizer)
    assert result.exit_status == "context_limit" and result.logical_length == limit
    assert env.calls == []  # truncated before its call: nothing to run
    session = scripted([call("execute_bash", cmd="ls")])
    short = len(tokenizer.encode(call("execute_bash", cmd="ls"))) + 1
    env2 = Env()
    result = run_episode(
        session, env2, "bug", r2e(context_limit=probe.logical_length + short), tokenizer=tokenizer
    )
    assert result.exit_status == "context_limit" and env2.calls == [("r2egym/execute_bash", {"cmd": "ls"})]


# ------------------------------------------------------------------------------------- drop-thinking
def test_thinking_offsets(tokenizer):
    def offsets(text):
        ids = tokenizer.encode(text, add_special_tokens=False)
        return tokenizer.decode([ids[i] for i in thinking_offsets(ids, tokenizer)]), tokenizer.decode(ids)

    assert offsets("no thinking " + call("finish"))[0] == ""
    dropped, _ = offsets("<think>\nplan\n</think>\n\nprose " + call("finish"))
    assert dropped == "<think>\nplan\n</think>\n\n"
    dropped, _ = offsets("pre <think>a</think> mid <think>b</think>\nafter")
    assert dropped == "pre <think>a</think> mid <think>b</think>\n"


@pytest.mark.parametrize("history", ["keep-thinking", "drop-thinking"])
def test_drop_thinking_forgets_each_past_reply_at_the_next_observation(scripted, tokenizer, history):
    replies = [
        "<think>\nfirst\n</think>\n\n" + call("execute_bash", cmd="ls"),
        "no think " + call("execute_bash", cmd="ls"),
        "<think>third</think>\n" + call("finish", command="submit"),
    ]
    session = scripted(replies)
    result = run_episode(session, Env(), "bug", r2e(history=history), tokenizer=tokenizer)
    assert result.exit_status == "submitted"
    if history == "keep-thinking":
        assert session.forgotten == [] and all(t.thinking_forgotten == 0 for t in result.turns)
        return
    (first,) = session.forgotten  # the 2nd reply has no thinking; the last is never followed
    start = result.prompt_tokens  # the first reply follows the prompt
    assert first[0] == start and first == list(range(start, first[-1] + 1))
    assert tokenizer.decode([session.history[p] for p in first]) == "<think>\nfirst\n</think>\n\n"
    assert result.turns[0].thinking_forgotten == len(first)
    # the context rule counts what the model still reads
    agent_room = 65_536 - (result.logical_length - len(first))
    assert session.calls[-1]["max_new_tokens"] == agent_room + result.turns[-1].reply_tokens


def test_drop_thinking_needs_forget(tokenizer, scripted):
    class NoForget:
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            if name == "forget":
                raise AttributeError(name)
            return getattr(self.inner, name)

    session = NoForget(scripted(["<think>x</think>" + call("execute_bash", cmd="ls")]))
    result = run_episode(session, Env(), "bug", r2e(history="drop-thinking"), tokenizer=tokenizer)
    assert result.exit_status == "error" and "needs a session with forget()" in result.error


def test_config_carries_the_prompt_texts_without_the_file(tmp_path, prompts):
    import pickle
    from dataclasses import replace
    from pathlib import Path

    cfg = AgentConfig(prompts=prompts, scaffold="r2egym")
    Path(prompts).unlink()  # e.g. a Ray worker on another node
    moved = replace(pickle.loads(pickle.dumps(cfg)), seed=5)
    assert moved.prompt_file().system_prompt == SYSTEM.rstrip("\n")
    record = moved.to_dict()
    assert "prompt_texts" not in record and len(record["prompts_sha256"]) == 64
