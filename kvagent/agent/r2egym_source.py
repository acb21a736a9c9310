"""`--r2egym PATH`: every string R2E-Gym shows the model, read from the user's own checkout of
R2E-Gym, never shipped with kvagent. The prompt file (`edit_non_fn_calling.yaml`) is read as YAML;
the strings R2E-Gym hard-codes in Python (the step countdown and the notice once the steps are used
up, in `agent/agent.py`; the observation for a reply without a call, `CONTINUE_MSG` in
`agenthub/__init__.py`) are read from the source as text, through its syntax tree: nothing of
R2E-Gym is imported or run. A checkout laid out otherwise is refused with one line, not guessed at.

Known layouts (under `src/r2egym/agenthub/`): `config/r2egym/edit_non_fn_calling.yaml`
(agentica-project/R2E-Gym, mid-2025, the DeepSWE release) and `config/edit_non_fn_calling.yaml`
(R2E-Gym/R2E-Gym, its first release)."""

from __future__ import annotations

import ast
from pathlib import Path

from kvagent.agent.prompt_file import PromptFile, load_prompt_file
from kvagent.errors import ConfigError

AGENTHUB = Path("src/r2egym/agenthub")
PROMPT_FILES = (Path("config/r2egym/edit_non_fn_calling.yaml"), Path("config/edit_non_fn_calling.yaml"))
AGENT_PY = Path("agent/agent.py")
CONSTANTS_PY = Path("__init__.py")
OBSERVATION_PY = Path("observation/observation.py")
STEP_MESSAGE = "stepcount_message"  # agent.py's variable for the countdown / the used-up notice
STEP_COUNT = "steps_remaining"  # the count inside its f-string
NO_CALL = "CONTINUE_MSG"


def _problem(root: Path, what: str) -> ConfigError:
    return ConfigError(
        f"r2egym: {root}: {what}; this R2E-Gym version's layout is not one kvagent knows (see "
        "docs/deepswe.md), pass the root of an R2E-Gym checkout or --prompts FILE alone"
    )


def _tree(root: Path, rel: Path) -> ast.Module:
    path = root / AGENTHUB / rel
    try:
        return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except FileNotFoundError:
        raise _problem(root, f"no {AGENTHUB / rel}") from None
    except (OSError, UnicodeDecodeError, SyntaxError) as e:
        raise _problem(root, f"cannot read {AGENTHUB / rel} ({type(e).__name__})") from None


def _assigned(tree: ast.AST, name: str) -> list[ast.expr]:
    """The values assigned to `name` anywhere in `tree`, in source order."""
    values = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            values.append(node.value)
    return sorted(values, key=lambda v: (v.lineno, v.col_offset))


def _template(node: ast.JoinedStr) -> str | None:
    """`f"... {steps_remaining} ..."` as a str.format template with `{remaining}`; None if it holds
    anything else."""
    out = []
    for part in node.values:
        if isinstance(part, ast.Constant) and isinstance(part.value, str):
            out.append(part.value.replace("{", "{{").replace("}", "}}"))
        elif (
            isinstance(part, ast.FormattedValue)
            and isinstance(part.value, ast.Name)
            and part.value.id == STEP_COUNT
            and part.conversion == -1
            and part.format_spec is None
        ):
            out.append("{remaining}")
        else:
            return None
    return "".join(out) if "{remaining}" in out else None


def step_messages(root: Path) -> tuple[str, str]:
    """(countdown template, used-up notice) from agent.py: every assignment to `stepcount_message`
    is either the countdown f-string or the notice string, each spelled one way only."""
    values = _assigned(_tree(root, AGENT_PY), STEP_MESSAGE)
    templates = {_template(v) for v in values if isinstance(v, ast.JoinedStr)}
    notices = {v.value for v in values if isinstance(v, ast.Constant) and isinstance(v.value, str)}
    others = [v for v in values if not isinstance(v, (ast.JoinedStr, ast.Constant))]
    if len(templates) != 1 or None in templates or len(notices) != 1 or others:
        raise _problem(root, f"{AGENTHUB / AGENT_PY}: `{STEP_MESSAGE}` is not one countdown and one notice")
    return templates.pop(), notices.pop()  # type: ignore[return-value]


def no_call_message(root: Path) -> str:
    """`CONTINUE_MSG` of agenthub/__init__.py (its last assignment), which observation.py shows."""
    values = [v for v in _assigned(_tree(root, CONSTANTS_PY), NO_CALL) if isinstance(v, ast.Constant)]
    uses = [n for n in ast.walk(_tree(root, OBSERVATION_PY)) if isinstance(n, ast.Name) and n.id == NO_CALL]
    if not values or not isinstance(values[-1].value, str) or not uses:
        raise _problem(root, f"no `{NO_CALL}` string shown by {AGENTHUB / OBSERVATION_PY}")
    return values[-1].value


def prompt_file_path(root: Path) -> Path:
    if not (root / AGENTHUB).is_dir():
        raise ConfigError(
            f"r2egym: {root} is not an R2E-Gym checkout (no {AGENTHUB}); pass the repository's root "
            "directory, e.g. --r2egym ~/src/R2E-Gym"
        )
    for rel in PROMPT_FILES:
        if (root / AGENTHUB / rel).is_file():
            return root / AGENTHUB / rel
    raise _problem(root, f"no {' or '.join(str(AGENTHUB / p) for p in PROMPT_FILES)}")


def load_checkout(path: str | Path) -> PromptFile:
    """The prompt texts of the checkout at `path` (its root): the prompt file's system and instance
    prompts, the countdown, the used-up notice and the no-call observation."""
    root = Path(path).expanduser()
    prompts = load_prompt_file(prompt_file_path(root))
    countdown, notice = step_messages(root)
    return PromptFile(
        path=str(root),
        system_prompt=prompts.system_prompt,
        instance_prompt=prompts.instance_prompt,
        steps_remaining=countdown,
        final_steps_notice=notice,
        no_call_message=no_call_message(root),
    )
