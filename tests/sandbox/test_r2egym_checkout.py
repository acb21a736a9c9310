"""`--r2egym PATH`: the sandbox installs the checkout's own tool scripts (a fixture checkout in
R2E-Gym's layout whose stand-in tools print a line kvagent's never print) and the r2egym profile runs
those, not kvagent's re-implementation; a checkout whose tools are missing or broken is refused with
one line before any episode, and a tool that cannot start in the sandbox with one line at install."""

from __future__ import annotations

import shutil

import pytest

from kvagent.agent import Agent, AgentConfig
from kvagent.agent.r2egym import bash_command
from kvagent.errors import ConfigError
from kvagent.sandbox.errors import SandboxError
from kvagent.testing import ScriptedSession
from tests.agent.test_r2egym_source import make_checkout
from tests.helpers import call

from .conftest import BACKENDS, make_repo, open_backend

HUB = ("src", "r2egym", "agenthub")


@pytest.fixture(params=BACKENDS)
def sb(request, tmp_path):
    box = open_backend(request.param, make_repo(tmp_path / "repo"), request)
    yield box
    box.close()


@pytest.fixture
def episode(sb, tokenizer):
    def run(checkout, *replies):
        """The observations the model reads for `replies` (then finish) under --r2egym `checkout`."""
        config = AgentConfig(scaffold="r2egym", r2egym_path=str(checkout) if checkout else None)
        session = ScriptedSession(tokenizer, [*replies, call("finish", command="submit")])
        result = Agent(session, sb, tokenizer, config).run("the bug")
        assert result.exit_status == "submitted", result.error
        return [t.observation for t in result.turns[:-1]]

    return run


def test_the_checkouts_tools_run_not_kvagents(sb, episode, tmp_path):
    checkout = make_checkout(tmp_path / "R2E-Gym")
    bash = call("execute_bash", cmd="echo from-the-model")
    view = call("file_editor", command="view", path="a.py")
    mine, _ = episode(checkout, bash, view)
    assert mine.startswith("Exit code: 0\nExecution output of [execute_bash]:\n")
    assert "FIXTURE-TOOL execute_bash ['--cmd', 'echo from-the-model']\nfrom-the-model\n" in mine
    kvagents, _ = episode(None, bash, view)  # no checkout: kvagent's re-implementation
    assert "FIXTURE-TOOL" not in kvagents and "[STDOUT]\n\nfrom-the-model" in kvagents


def test_a_script_without_its_interpreter_runs_through_the_sandboxs(sb, episode, tmp_path):
    """search.py's `#!/root/.venv/bin/python` exists in R2E-Gym's images only; elsewhere the call
    still runs the checkout's script (with the sandbox's python), the shell's own call cannot."""
    (search,) = episode(make_checkout(tmp_path / "R2E-Gym"), call("search", search_term="add"))
    assert search == (
        "Execution output of [search]:\nFIXTURE-TOOL search ['--search_term', 'add']\n\nMoves left: 39 (of many)"
    )


def test_the_tools_are_commands_on_the_shells_path(sb, episode, tmp_path):
    """Installed where R2E-Gym installs them, so the model's own shell commands can call them."""
    (out,) = episode(make_checkout(tmp_path / "R2E-Gym"), call("execute_bash", cmd="file_editor view"))
    assert "FIXTURE-TOOL file_editor ['view']" in out
    where = sb.run_command("sh -c 'command -v file_editor'").output.strip()
    assert where == f"{sb.commands_dir}/file_editor"


def test_the_call_line_is_r2egyms(sb, episode, tmp_path):
    """`NAME COMMAND --key value` in the order written, keys unquoted, values shell-quoted, under
    `timeout`, PATH the only variable kvagent sets (the image's own stay: LANG in the base image)."""
    params = {"path": "it's.py", "command": "view", "view_range": "[1, 2]"}
    assert (
        bash_command("file_editor", params) == "file_editor view --path 'it'\"'\"'s.py' --view_range '[1, 2]'"
    )
    assert bash_command("submit", {}) == "echo '<<<Finished>>>'"
    sb.install_commands(
        {
            "show": b"#!/bin/sh\necho \"$0 $*\"; env | grep -E '^(TERM|PAGER|PYTHONIOENCODING|KVAGENT_TOOL_[A-Z]*)=' | wc -l\n"
        }
    )
    r = sb.run_command(bash_command("show", params), timeout=5)
    assert r.output == f"{sb.commands_dir}/show view --path it's.py --view_range [1, 2]\n0\n"
    slow = sb.run_command("sleep 5", timeout=0.5)
    assert slow.exit_code == 124 and not slow.timed_out  # `timeout`'s status, as R2E-Gym reads it


def test_a_tool_that_cannot_start_is_one_line(sb):
    with pytest.raises(SandboxError) as e:
        sb.install_commands(
            {
                "finish": b"#!/usr/bin/env python3\nprint('ok')\n",
                "file_editor": b"#!/usr/bin/env python3\nimport chardet_not_installed_here\n",
            }
        )
    msg = str(e.value)
    assert "\n" not in msg and "file_editor" in msg and "chardet_not_installed_here" in msg


@pytest.mark.parametrize(
    ("breakage", "needle"),
    [
        (
            lambda hub: (hub / "tools" / "search.py").unlink(),
            "no tool script ./src/r2egym/agenthub/tools/search.py",
        ),
        (
            lambda hub: (hub / "tools" / "r2egym" / "file_editor.py").write_text("def broken(:\n"),
            "file_editor.py does not compile (SyntaxError",
        ),
        (lambda hub: shutil.rmtree(hub / "tools"), "no tool script"),
    ],
    ids=["missing", "syntax-error", "no-tools-dir"],
)
def test_a_checkout_with_broken_tools_is_refused_with_one_line(tmp_path, breakage, needle):
    checkout = make_checkout(tmp_path / "R2E-Gym")
    breakage(checkout.joinpath(*HUB))
    with pytest.raises(ConfigError) as e:
        AgentConfig(scaffold="r2egym", r2egym_path=str(checkout))
    msg = str(e.value)
    assert "\n" not in msg and needle in msg and "drop --r2egym" in msg, msg


def test_a_prompt_file_without_the_protocols_tools_is_refused(tmp_path):
    checkout = make_checkout(tmp_path / "R2E-Gym")
    prompt = checkout.joinpath(*HUB, "config", "r2egym", "edit_non_fn_calling.yaml")
    prompt.write_text(prompt.read_text().replace("- ./src/r2egym/agenthub/tools/search.py\n", ""))
    with pytest.raises(ConfigError, match="command_files has no search tool"):
        AgentConfig(scaffold="r2egym", r2egym_path=str(checkout))
    prompt.write_text("system_prompt: x\ninstance_prompt: '{problem_statement}'\n")
    with pytest.raises(ConfigError, match="lists no command_files"):
        AgentConfig(scaffold="r2egym", r2egym_path=str(checkout))


def test_var_tmp_is_the_sandboxs_own_and_lasts_across_commands(sb):
    """R2E-Gym's editor keeps its undo history in /var/tmp between calls, as a container's /var/tmp."""
    sb.run_command("sh -c 'echo kept > /var/tmp/editor_state.json'")
    assert sb.run_command("cat /var/tmp/editor_state.json").output == "kept\n"


def test_chardets_release_is_the_one_the_checkouts_uv_lock_pins(tmp_path):
    """R2E-Gym's runtime installs the newest chardet (pinned 5.2.0 in its uv.lock at the DeepSWE
    release); kvagent caps at the checkout's pin. No uv.lock: no cap, nothing provided."""
    from kvagent.agent.r2egym_tools import chardet_cap

    checkout = make_checkout(tmp_path / "R2E-Gym")
    assert chardet_cap(checkout) is None
    assert AgentConfig(scaffold="r2egym", r2egym_path=str(checkout)).tool_wheels == ()
    lock = (
        '[[package]]\nname = "certifi"\nversion = "1.0"\n\n[[package]]\nname = "chardet"\nversion = "5.2.0"\n'
    )
    (checkout / "uv.lock").write_text(lock)
    assert chardet_cap(checkout) == "5.2.0"
