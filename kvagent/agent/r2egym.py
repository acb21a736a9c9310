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
PATCH_TIMEOUT = 120  # R2E-Gym's CMD_TIMEOUT, which its end-of-episode `get_patch` runs under

# First `<function=` to the first `</function>` after it (non-greedy, across lines).
_BLOCK = re.compile(r"(?s)<function=.*?</function>")
_NAME = re.compile(r"<function\s*=\s*([^>]+)>")
_PARAM = re.compile(r"(?s)<parameter\s*=\s*([^>]+)>(.*?)</parameter>")
_ANSI = re.compile(r"\x1b\[[0-9;]*m|\r")
_ISSUE = re.compile(r"(?s)\[ISSUE\](.*)\[/ISSUE\]")
_THOUGHT = re.compile(r"(?s)<think>.*?</think>")  # the first <think> block, as R2E-Gym keeps it
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


def output_patch(env: Any, full: str) -> str:
    """R2E-Gym's `output_patch`: `git add -A && git diff --cached` run as its runtime runs any command
    (`DockerRuntime.get_patch`): git's defaults, so renames are detected and non-ASCII paths quoted;
    stdout and stderr together; on success carriage returns removed, so a CRLF file's section no
    longer applies (odd). `env.r2egym_diff` runs it (sandbox.Sandbox); an environment without it (a
    test double) gives `full` with its carriage returns removed."""
    run = getattr(env, "r2egym_diff", None)
    if run is None:
        return full.replace("\r", "")
    try:
        result = run(PATCH_TIMEOUT)
    except Exception as e:  # R2E-Gym's `run` returns an exception's text as the output, so does this
        return f"Error: {e!r}"
    return runtime_output(result, PATCH_TIMEOUT)[0]


def graded_patch(patch: str, edited: list[str]) -> str:
    """R2E-Gym's submitted patch (its `true_output_patch`) from its `output_patch`: each file section
    parsed and written back (R2E-Gym's ParsedCommit), `.py` files only, and of those only the
    `edited` ones when any str_replace was made (all `.py` files when none was). A diff its parser
    refuses (a rename, a header line it does not know) gives the whole `patch` instead, as R2E-Gym
    falls back to its `output_patch`."""
    try:
        sections = _parse_sections(patch)
    except ValueError:
        return patch
    return "".join(text for path, text in sections if path.endswith(".py") and (not edited or path in edited))


_HEADER = re.compile(r'diff --git (?:")?a/([^"]+)(?:")? (?:")?b/([^"]+)(?:")?')
_HUNK = re.compile(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)")
_MODES = ("old mode", "new mode", "deleted file mode", "new file mode")


def _parse_sections(patch: str) -> list[tuple[str, str]]:
    """(path, section as R2E-Gym writes it back) per file of a diff, read line by line as R2E-Gym's
    CommitParser reads it; ValueError where it raises. Facts of that parser kept: a section's old
    and new paths must be equal (no renames); quotes around a path are dropped, its escapes kept;
    outside a hunk only index, mode, ---/+++, `Binary files` and empty lines are allowed; inside one,
    a line that is no context, +, - or \\ note is dropped; and the empty string after the diff's last
    newline is read as one more context line of the last hunk (it is written back as " ")."""
    files: list[dict[str, Any]] = []
    for line in patch.split("\n"):
        if line.startswith("diff --git"):
            m = _HEADER.match(line)
            if not m:
                raise ValueError(f"invalid diff header: {line}")
            if m.group(1) != m.group(2):
                raise ValueError(f"renamed {m.group(1)} -> {m.group(2)}: not supported")
            files.append({"path": m.group(1), "misc": [], "index": "", "binary": "", "minus": None,
                          "plus": None, "hunks": []})  # fmt: skip
            continue
        if not files:
            continue  # before the first section (a warning on stderr): ignored
        f = files[-1]
        if line.startswith("@@ "):
            h = _HUNK.match(line)
            if not h:
                raise ValueError(f"invalid hunk header: {line}")
            old, old_n, new, new_n, section = h.groups()
            head = f"@@ -{_range(old, old_n)} +{_range(new, new_n)} @@"
            section = section.lstrip()
            f["hunks"].append([head + (f" {section}" if section else "")])
        if not f["hunks"]:
            if line.startswith("index"):
                parts = line.split()
                hashes = parts[1].split("..") if len(parts) > 1 else []
                if len(hashes) != 2:
                    raise ValueError(f"invalid index line: {line}")
                mode = f" {parts[2]}" if len(parts) > 2 else ""
                f["index"] = f"index {hashes[0]}..{hashes[1]}{mode}\n"
            elif line.startswith(_MODES):
                f["misc"].append(line)
            elif line.startswith("+++ "):
                f["plus"] = line[4:]
            elif line.startswith("--- "):
                f["minus"] = line[4:]
            elif line.startswith("Binary files"):
                f["binary"] = line + "\n"
            elif line != "":
                raise ValueError(f"unexpected line: {line}")
        elif not line.startswith("@@ "):
            if line == "" or line.startswith((" ", "-", "+")):
                f["hunks"][-1].append((line[:1] or " ") + line[1:])
            elif line.startswith("\\"):
                f["hunks"][-1].append("\\ " + line[2:])
    return [(f["path"], _write_section(f)) for f in files]


def _range(start: str, length: str | None) -> str:
    return f"{int(start)},{int(length)}" if length else f"{int(start)}"


def _write_section(f: dict[str, Any]) -> str:
    out = f"diff --git a/{f['path']} b/{f['path']}\n"
    out += "".join(f"{m}\n" for m in f["misc"]) + f["index"] + f["binary"]
    if f["minus"] is not None and f["plus"] is not None:
        out += f"--- {f['minus']}\n+++ {f['plus']}\n"
    return out + "".join(f"{line}\n" for hunk in f["hunks"] for line in hunk)
