"""The system prompt and the instance (first user) prompt, from the templates in `prompts/`.

The function blocks of the system prompt are written from `tools.TOOLS`, the same specs that the
parser validates against."""

from __future__ import annotations

import re
from functools import cache
from importlib.resources import files
from string import Template

from kvagent.agent.tools import TOOLS, ToolSpec
from kvagent.errors import KvagentError

# repository-first is what evaluation runs use; issue-first is the DeepSWE training phrasing.
INSTANCE_STYLES = {"repo_first": "instance_repo_first.md", "issue_first": "instance_issue_first.md"}
DEFAULT_STYLE = "repo_first"
_ISSUE_TAGS = re.compile(r"(?s)\[ISSUE\](.*?)\[/ISSUE\]")


@cache
def _template(name: str) -> Template:
    return Template(files("kvagent.agent").joinpath("prompts", name).read_text(encoding="utf-8").rstrip("\n"))


def function_block(k: int, spec: ToolSpec) -> str:
    lines = [
        f"---- BEGIN FUNCTION #{k}: {spec.name} ----",
        "Description:",
        spec.description,
        "",
        "Parameters:",
    ]
    for i, p in enumerate(spec.params, 1):
        need = "required" if p.required else "optional"
        line = f"  ({i}) {p.name} ({p.type}, {need}): {p.description}"
        if p.choices:
            line += f" Allowed values: [{', '.join(p.choices)}]."
        lines.append(line)
    lines.append(f"---- END FUNCTION #{k} ----")
    return "\n".join(lines)


def system_prompt(tools: tuple[ToolSpec, ...] = TOOLS) -> str:
    blocks = "\n\n".join(function_block(k, spec) for k, spec in enumerate(tools, 1))
    return _template("system.md").substitute(functions=blocks)


def extract_issue(problem_statement: str) -> str:
    """Only the `[ISSUE]...[/ISSUE]` part when the statement has one (R2E-Gym statements do)."""
    m = _ISSUE_TAGS.search(problem_statement)
    return (m.group(1) if m else problem_statement).strip()


def instance_prompt(problem_statement: str, style: str = DEFAULT_STYLE, repo_dir: str = "/testbed") -> str:
    if style not in INSTANCE_STYLES:
        raise KvagentError(f"prompt style {style!r} is unknown; choose one of {', '.join(INSTANCE_STYLES)}")
    return _template(INSTANCE_STYLES[style]).substitute(
        issue=extract_issue(problem_statement), repo_dir=repo_dir
    )
