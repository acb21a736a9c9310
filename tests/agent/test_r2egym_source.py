"""`--r2egym PATH`: every R2E-Gym string the model reads comes from the user's checkout. A FAKE
checkout (made-up strings in R2E-Gym's layout) is built here: the prompt file, the countdown and the
used-up notice of agent.py, the no-call observation of agenthub/__init__.py. Changing any of them
there changes what the model reads; a layout kvagent does not know is one line naming it."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvagent.agent import Agent, AgentConfig
from kvagent.agent.r2egym_source import load_checkout
from kvagent.errors import ConfigError
from kvagent.testing import ScriptedSession
from tests.helpers import call

from .test_r2egym_profile import Env

AGENT_PY = """
class Agent:
    def prepare(self, steps_remaining):
        if steps_remaining > 0:
            stepcount_message = f"{COUNT}"
        else:
            stepcount_message = "{NOTICE}"
        return stepcount_message

    def run(self, max_steps, step_count):
        steps_remaining = max_steps - step_count
        if steps_remaining > 0:
            stepcount_message = f"{COUNT}"
        else:
            stepcount_message = "{NOTICE}"
        # stepcount_message = f"an old comment: {{steps_remaining}}"
        return stepcount_message
"""
STRINGS = {
    "SYSTEM": "You are Fake Agent. Functions: execute_bash, finish.",
    "INSTANCE": "Issue, in {working_dir}:\n{problem_statement}\nDo it.",
    "COUNT": "Moves left: {steps_remaining} (of many)",
    "NOTICE": "No moves left; finish now.",
    "NO_CALL": "\nCall a function, please.\n",
}


# Stand-in tools in R2E-Gym's layout (the files its prompt file lists), our own tiny scripts: each
# prints a line no kvagent tool prints, its name and its arguments, so a test can tell who ran.
TOOL_FILES = {
    "tools/r2egym/file_editor.py": "#!/usr/bin/env python3",
    "tools/search.py": "#!/root/.venv/bin/python",  # R2E-Gym's interpreter: absent outside its images
    "tools/r2egym/execute_bash.py": "#!/usr/bin/env python3",
    "tools/finish.py": "#!/root/.venv/bin/python",
}
TOOL_BODY = """
import argparse, subprocess, sys
parser = argparse.ArgumentParser()
parser.add_argument("command", nargs="?")
parser.add_argument("--cmd")
parser.add_argument("--path")
parser.add_argument("--search_term")
args = parser.parse_args()
print("FIXTURE-TOOL", sys.argv[0].rsplit("/", 1)[-1], sys.argv[1:], flush=True)
if args.cmd:
    sys.exit(subprocess.call(args.cmd, shell=True))
"""


def make_tools(hub: Path, files: dict[str, str] = TOOL_FILES) -> list[str]:
    for rel, shebang in files.items():
        (hub / rel).parent.mkdir(parents=True, exist_ok=True)
        (hub / rel).write_text(shebang + "\n" + TOOL_BODY)
    return [f"./src/r2egym/agenthub/{rel}" for rel in files]


def make_checkout(root: Path, layout: str = "config/r2egym", **changes: str) -> Path:
    s = {**STRINGS, **changes}
    hub = root / "src" / "r2egym" / "agenthub"
    (hub / "agent").mkdir(parents=True)
    (hub / "observation").mkdir()
    (hub / layout).mkdir(parents=True, exist_ok=True)
    (hub / "agent" / "agent.py").write_text(
        AGENT_PY.replace("{COUNT}", s["COUNT"]).replace("{NOTICE}", s["NOTICE"])
    )
    (hub / "__init__.py").write_text(
        f'# CONTINUE_MSG = "an old one"\nCONTINUE_MSG = {s["NO_CALL"]!r}\nCMD_TIMEOUT = 120\n'
    )
    (hub / "observation" / "observation.py").write_text(
        "from r2egym.agenthub import CONTINUE_MSG\n\ndef show(name):\n    return CONTINUE_MSG if not name else name\n"
    )
    import yaml

    prompt = {
        "system_prompt": s["SYSTEM"],
        "instance_prompt": s["INSTANCE"],
        "llm_name": "x",
        "command_files": make_tools(hub),
    }
    (hub / layout / "edit_non_fn_calling.yaml").write_text(yaml.safe_dump(prompt))
    return root


def first_two_calls(checkout: Path, tokenizer) -> tuple[str, str, str]:
    """(system prompt, first user message, the observation of a reply without a call) as the model
    reads them, with max_steps 1 past the soft limit so the notice shows."""
    config = AgentConfig(
        scaffold="r2egym", r2egym_path=str(checkout), soft_step_limit=1, history="keep-thinking"
    )
    session = ScriptedSession(tokenizer, ["no call here", call("finish", command="submit")])
    agent = Agent(session, Env(), tokenizer, config)
    result = agent.run("the bug")
    assert result.exit_status == "submitted"
    return result.messages[0]["content"], result.messages[1]["content"], result.messages[3]["content"]


def test_every_string_comes_from_the_checkout(tmp_path, tokenizer):
    system, user, no_call = first_two_calls(make_checkout(tmp_path / "a"), tokenizer)
    assert system == STRINGS["SYSTEM"]
    assert user == "Issue, in /testbed:\nthe bug\nDo it.\nMoves left: 1 (of many)"
    assert no_call == "\nCall a function, please.\n\nNo moves left; finish now."


@pytest.mark.parametrize("key", list(STRINGS))
def test_changing_a_string_in_the_checkout_changes_what_the_model_reads(tmp_path, tokenizer, key):
    base = first_two_calls(make_checkout(tmp_path / "a"), tokenizer)
    changed_text = {"INSTANCE": "Other:\n{problem_statement}", "COUNT": "Left {steps_remaining}"}.get(
        key, "CHANGED"
    )
    changed = first_two_calls(make_checkout(tmp_path / "b", **{key: changed_text}), tokenizer)
    assert base != changed
    assert any(changed_text.split("{")[0] in part for part in changed)


def test_the_older_layout_is_read_too(tmp_path):
    texts = load_checkout(make_checkout(tmp_path, layout="config"))
    assert (
        texts.system_prompt == STRINGS["SYSTEM"]
        and texts.steps_remaining == "Moves left: {remaining} (of many)"
    )


def test_the_prompt_file_overrides_the_checkouts(tmp_path, tokenizer):
    own = tmp_path / "own.yaml"
    own.write_text("system_prompt: Mine.\ninstance_prompt: 'Mine: {problem_statement}'\n")
    config = AgentConfig(scaffold="r2egym", r2egym_path=str(make_checkout(tmp_path / "c")), prompts=str(own))
    texts = dict(config.prompt_texts)
    assert texts["system_prompt"] == "Mine." and texts["final_steps_notice"] == STRINGS["NOTICE"]


@pytest.mark.parametrize(
    ("breakage", "needle"),
    [
        (
            lambda hub: (hub / "config" / "r2egym" / "edit_non_fn_calling.yaml").unlink(),
            "edit_non_fn_calling.yaml",
        ),
        (lambda hub: (hub / "agent" / "agent.py").write_text("x = 1\n"), "stepcount_message"),
        (
            lambda hub: (hub / "agent" / "agent.py").write_text(
                'stepcount_message = f"{steps_remaining} {max_steps}"\nstepcount_message = "x"\n'
            ),
            "stepcount_message",
        ),
        (lambda hub: (hub / "__init__.py").write_text("OTHER = 1\n"), "CONTINUE_MSG"),
        (lambda hub: (hub / "observation" / "observation.py").write_text("x = 1\n"), "CONTINUE_MSG"),
    ],
    ids=["no-prompt-file", "no-step-message", "other-countdown", "no-continue-msg", "not-shown"],
)
def test_unknown_layout_is_one_line(tmp_path, breakage, needle):
    root = make_checkout(tmp_path)
    breakage(root / "src" / "r2egym" / "agenthub")
    with pytest.raises(ConfigError) as e:
        AgentConfig(scaffold="r2egym", r2egym_path=str(root))
    message = str(e.value)
    assert "\n" not in message and needle in message and "not one kvagent knows" in message


def test_not_a_checkout_and_wrong_scaffold(tmp_path):
    with pytest.raises(ConfigError, match="is not an R2E-Gym checkout"):
        AgentConfig(scaffold="r2egym", r2egym_path=str(tmp_path))
    with pytest.raises(ConfigError, match="add --scaffold r2egym"):
        AgentConfig(r2egym_path=str(make_checkout(tmp_path / "x")))
