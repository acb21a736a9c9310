"""R2E-Gym's evaluation protocol (the scaffold DeepSWE-Preview was measured with), as facts the
`r2egym` profile reproduces: how a reply's call is read, how a tool result becomes the observation,
and the step countdown. Written from R2E-Gym's behaviour (agenthub/agent, action, observation,
runtime); docs/deepswe.md lists every point and where R2E-Gym is odd."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
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
_THOUGHT = re.compile(r"(?s)<think>.*?</think>")  # the first <think> block, as R2E-Gym keeps it
_SECTION = re.compile(r"^diff --git ", re.MULTILINE)
_FILE_LINE = re.compile(r"^(?:\+\+\+ b/|--- a/)(.*)$", re.MULTILINE)
THINK_END = "</think>"


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

    def to_xml(self) -> str:
        """The call re-serialised as R2E-Gym writes it back into the history (its `to_xml_string`):
        parameters in order, two-space indent; a reply without a call gives an empty block."""
        params = "".join(f"  <parameter={k}>{v}</parameter>\n" for k, v in self.params.items())
        return f"<function={self.name}>\n{params}</function>"


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


def bash_command(name: str, params: Mapping[str, str]) -> str:
    """The shell line R2E-Gym's runtime runs for a call of its installed tools (`Action.to_bashcmd`):
    the name, the `command` parameter, then `--KEY VALUE` for each other parameter in the order
    written; the name and the values quoted, the keys not (odd); `finish` / `submit` only echo."""
    if name in ("finish", "submit"):
        return "echo '<<<Finished>>>'"
    words = [shlex.quote(name)]
    if "command" in params:
        words.append(shlex.quote(str(params["command"])))
    for key, value in params.items():
        if key != "command":
            words += [f"--{key}", shlex.quote(str(value))]
    return " ".join(words)


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


def history_content(reply: str) -> str:
    """What the model reads of an earlier reply in R2E-Gym: R2E-Gym stores the reply's first
    `<think>` block (stripped) + a blank line + the call re-serialised, and the chat template
    (Qwen3's, DeepSWE's) shows an earlier assistant turn from after its last `</think>`, leading
    newlines dropped: the call block alone when the reply had a `<think>` block, else the blank
    line and the call block."""
    m = _THOUGHT.search(reply)
    content = f"{m.group(0).strip() if m else ''}\n\n{parse_action(reply).to_xml()}"
    if THINK_END in content:
        content = content.split(THINK_END)[-1].lstrip("\n")
    return content


# ------------------------------------------------------------------------------ the graded patch
def edited_paths(calls: list[dict[str, Any] | None], workdir: str = "/testbed") -> list[str]:
    """R2E-Gym's edited files: the `path` of every file_editor str_replace call (run or not, as it
    reads them off the trajectory), the working directory's prefix removed, a name with a dot only."""
    prefix = workdir.rstrip("/") + "/"
    out = []
    for c in calls:
        if not c or c.get("name") != "file_editor" or c["params"].get("command") != "str_replace":
            continue
        path = c["params"].get("path") or ""
        if path and "." in path.split("/")[-1]:
            out.append(path.replace(prefix, ""))
    return out


def graded_patch(patch: str, edited: list[str]) -> str:
    """R2E-Gym's submitted patch (its `true_output_patch`): the diff's sections for `.py` files
    only, and of those only the `edited` ones when any str_replace was made (all `.py` files when
    none was). The sections are kept as the diff wrote them."""
    return "".join(
        text
        for path, text in _file_sections(patch)
        if path.endswith(".py") and (not edited or path in edited)
    )


def _file_sections(patch: str) -> list[tuple[str, str]]:
    """(path, section text) per file of a `git diff` (the new path; the old one for a deletion)."""
    starts = [m.start() for m in _SECTION.finditer(patch)]
    sections = []
    for i, start in enumerate(starts):
        text = patch[start : starts[i + 1] if i + 1 < len(starts) else len(patch)]
        names = [n for n in _FILE_LINE.findall(text.split("\n@@", 1)[0]) if n != "/dev/null"]
        if names:
            path = names[-1]  # +++ b/ comes after --- a/
        else:  # no ---/+++ lines (mode change, empty file): `diff --git a/P b/P`
            head = text.split("\n", 1)[0]
            path = head[head.rfind(" b/") + 3 :] if " b/" in head else ""
        sections.append((path.strip('"'), text))
    return sections
