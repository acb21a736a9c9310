"""R2E-Gym's evaluation protocol (the scaffold DeepSWE-Preview was measured with), as facts the
`r2egym` profile reproduces: how a reply's call is read, how a tool result becomes the observation,
and the step countdown. Written from R2E-Gym's behaviour (agenthub/agent, action, observation,
runtime); docs/deepswe.md lists every point and where R2E-Gym is odd."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

# The four tools of config/r2egym/edit_non_fn_calling.yaml, named as its command files are.
TOOLS = ("file_editor", "search", "execute_bash", "finish")
FINISHED = "<<< Finished >>>"
KEEP_LINES = 40  # execute_bash output longer than 2 x 40 lines keeps 40 + 40
DIVIDER = "-" * 50
TRUNCATED = "<Observation truncated in middle for saving context>"
TIMEOUT_EXIT = 124  # `timeout`'s exit status; R2E-Gym reads it (from any command) as a timeout

# First `<function=` to the first `</function>` after it (non-greedy, across lines).
_BLOCK = re.compile(r"(?s)<function=.*?</function>")
_NAME = re.compile(r"<function\s*=\s*([^>]+)>")
_PARAM = re.compile(r"(?s)<parameter\s*=\s*([^>]+)>(.*?)</parameter>")
_ANSI = re.compile(r"\x1b\[[0-9;]*m|\r")
_ISSUE = re.compile(r"(?s)\[ISSUE\](.*)\[/ISSUE\]")


@dataclass(frozen=True)
class Action:
    """A parsed reply: `name` is "" when the reply holds no call block."""

    name: str = ""
    params: dict[str, str] = field(default_factory=dict)

    @property
    def ends_episode(self) -> bool:
        # R2E-Gym ends on any name that merely contains finish/submit, known tool or not.
        low = self.name.lower()
        return "finish" in low or "submit" in low

    @property
    def known(self) -> bool:
        return self.name in TOOLS


def parse_action(reply: str) -> Action:
    """The call as R2E-Gym reads it: the first block; name and every parameter key and value stripped;
    a parameter given twice keeps its last value; nothing validated (the tools do that)."""
    m = _BLOCK.search(reply)
    if m is None:
        return Action()
    block = m.group(0).strip()
    head = _NAME.search(block)
    params: dict[str, str] = {}
    for key, value in _PARAM.findall(block):
        params[key.strip()] = value.strip()
    return Action(head.group(1).strip() if head else "", params)


def task_instruction(problem_statement: str) -> str:
    """What R2E-Gym puts in {problem_statement}: the text between the first [ISSUE] and the last
    [/ISSUE] (unstripped) when there is one, else the whole statement."""
    m = _ISSUE.search(problem_statement)
    return m.group(1) if m else problem_statement


def steps_line(steps_done: int, max_steps: int, template: str, final_notice: str) -> str:
    """The countdown R2E-Gym appends before each model call: from `max_steps` (its soft limit) down
    to 1, then the submit-now notice for every later call."""
    remaining = max_steps - steps_done
    return template.format(remaining=remaining) if remaining > 0 else final_notice


def with_steps_line(message: str, line: str) -> str:
    return f"{message}\n{line}"


def runtime_output(result: Any, timeout: float) -> tuple[str, str]:
    """(output, error code text) as R2E-Gym's docker runtime returns a tool's run: a timeout (exit 124
    or killed) replaces the output; another failure keeps it raw and reports "Error: Exit code N"; a
    success has ANSI colour codes and carriage returns removed."""
    if getattr(result, "timed_out", False) or result.exit_code == TIMEOUT_EXIT:
        return f"The command took too long to execute (>{timeout:g}s)", "-1"
    if result.exit_code != 0:
        return str(result.output), f"Error: Exit code {result.exit_code}"
    return _ANSI.sub("", str(result.output)), "0"


def truncate_middle(output: str, keep: int = KEEP_LINES) -> str:
    lines = output.splitlines()
    if len(lines) <= 2 * keep:
        return output
    head, tail = "\n".join(lines[:keep]), "\n".join(lines[-keep:])
    return f"{head}\n{DIVIDER}\n{TRUNCATED}\n{DIVIDER}\n{tail}"


def observation(name: str, output: str, code: str) -> str:
    """The observation text for a call (R2E-Gym's Observation.__str__ for a named call)."""
    if name in ("finish", "submit"):
        return FINISHED
    if name in ("execute_bash", "bash"):
        return f"Exit code: {code}\nExecution output of [{name}]:\n{truncate_middle(output)}"
    return f"Execution output of [{name}]:\n{output}"


def unknown_tool_observation(name: str) -> str:
    """R2E-Gym refuses a name outside its tools with an exception whose text it then drops: the model
    sees an empty output (and exit code -1 where the name is shown with one)."""
    return observation(name, "", "-1")
