"""`kvagent inspect`: an episode written by the real trajectory writer (scripted model, evicting cache
statistics) shown in the terminal and as one static HTML page with the cache plot."""

from __future__ import annotations

import base64
import io
import json
import re

import pytest
from rich.console import Console
from typer.testing import CliRunner

from kvagent.agent import AgentConfig
from kvagent.agent.solve import solve_episode
from kvagent.cli.app import app
from kvagent.cli.inspect.run import run_inspect
from kvagent.runtime import CacheConfig
from kvagent.testing import FakeStats, ScriptedSession
from tests.helpers import FIX_MEAN, call

VIEW = "Let me read the module.\n" + call("file_editor", command="view", path="/testbed/calc/__init__.py")
BAD = "I think the answer is obvious."  # no call: the turn records a call error
FINISH = call("finish", command="submit", result="Fixed the denominator.")


class EvictingSession(ScriptedSession):
    """Scripted replies over a cache that holds at most `budget` entries and evicts the rest in rounds."""

    @property
    def stats(self):
        n, k = len(self.history), self.budget
        evicted = max(0, n - k)
        return FakeStats(n, [min(n, k)] * self.layers, min(n, k) * self.layers * 64, rounds=-(-evicted // 64),
                         evicted=evicted * self.layers)  # fmt: skip


class Engine:
    name = "scripted-model"

    def __init__(self, tokenizer, replies):
        self.tokenizer, self.replies = tokenizer, replies

    def session(self, config):
        return EvictingSession(self.tokenizer, self.replies, budget=config.budget)


@pytest.fixture
def trajectory(tmp_path, tokenizer, fake_env):
    path = tmp_path / "runs" / "calc.traj.json"
    result = solve_episode(
        Engine(tokenizer, [VIEW, BAD, FIX_MEAN, FINISH]),
        fake_env,
        "mean([1, 2, 3]) returns 1.5 instead of 2.",
        cache_config=CacheConfig(policy="random", budget=1024, buffer=64, protect="sink"),
        config=AgentConfig(max_steps=10),
        trajectory_path=path,
        meta={"instance_id": "calc-1"},
    )
    assert result.exit_status == "submitted" and result.turns[-1].cache["evicted"] > 0
    return path


def shown(path, **kw):
    console = Console(file=io.StringIO(), width=160, color_system=None)
    run_inspect(str(path), console=console, **kw)
    return console.file.getvalue()


def test_terminal_shows_turns_calls_observations_and_cache_stats(trajectory):
    text = shown(trajectory)
    assert "calc-1" in text and "scripted-model" in text and "random K=1024 r=64" in text
    assert "submitted" in text
    for step, tool in ((1, "file_editor"), (2, "(no valid call)"), (3, "file_editor"), (4, "finish")):
        assert f"step {step}: {tool}" in text
    assert "Let me read the module." in text and "call file_editor  command=view" in text
    assert "no valid call:" in text
    assert "return total / (len(values) + 1)" in text  # the view's observation
    assert "per-turn cache statistics" in text and "evicted" in text
    data = json.loads(trajectory.read_text())
    last = data["turns"][-1]
    assert f"{last['cache']['evicted']:,}" in text and f"rounds {last['cache']['rounds']:,}" in text
    assert "+    return total / len(values)" in text  # the patch


def test_one_turn_in_full(trajectory):
    text = shown(trajectory, turn=3)
    assert "step 3: file_editor" in text and "str_replace" in text
    assert "step 1:" not in text and "per-turn cache statistics" not in text


def test_html_page_has_turns_calls_stats_and_the_plot(trajectory, tmp_path):
    out = tmp_path / "page" / "episode.html"
    shown(trajectory, html=str(out))
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "step 1: file_editor" in page and "step 4: finish" in page
    assert "Let me read the module." in page and "str_replace" in page
    assert "return total / (len(values) + 1)" in page  # an observation
    data = json.loads(trajectory.read_text())
    assert f'<td class="">{data["turns"][-1]["cache"]["evicted"]:,}</td>' in page  # the stats table
    png = re.search(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert png and base64.b64decode(png.group(1)).startswith(b"\x89PNG\r\n\x1a\n")
    assert "<script" not in page


def test_a_directory_lists_its_episodes_and_html_holds_them_all(trajectory, tmp_path):
    second = trajectory.with_name("other.traj.json")
    data = json.loads(trajectory.read_text())
    second.write_text(json.dumps({**data, "exit_status": "step_limit"}))
    text = shown(trajectory.parent, html=str(tmp_path / "all.html"))
    assert "2 episodes" in text and "calc.traj.json" in text and "other.traj.json" in text
    assert "step_limit" in text and "submitted" in text
    page = (tmp_path / "all.html").read_text()
    assert page.count("data:image/png;base64,") == 2 and "other.traj.json" in page


def test_another_scaffolds_messages_are_shown_without_stats(tmp_path):
    path = tmp_path / "mini.traj.json"
    messages = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "fix it"},
        {"role": "assistant", "content": "run ls", "tool_calls": [{"name": "bash", "arguments": "{}"}]},
        {"role": "tool", "content": "setup.py"},
    ]
    path.write_text(json.dumps({"messages": messages}))
    text = shown(path, html=str(tmp_path / "m.html"))
    assert "step 1: bash" in text and "setup.py" in text
    assert "no per-turn cache statistics" in (tmp_path / "m.html").read_text()


def test_cli_inspect_and_its_errors(trajectory, tmp_path):
    runner = CliRunner()
    ok = runner.invoke(app, ["inspect", str(trajectory), "--turn", "1"])
    assert ok.exit_code == 0 and "step 1: file_editor" in ok.output
    missing = runner.invoke(app, ["inspect", str(tmp_path / "nope.traj.json")])
    assert missing.exit_code == 2 and "does not exist" in missing.output
    bad_turn = runner.invoke(app, ["inspect", str(trajectory), "--turn", "9"])
    assert bad_turn.exit_code == 2 and "steps 1..4, not 9" in bad_turn.output
    empty = tmp_path / "empty"
    empty.mkdir()
    nothing = runner.invoke(app, ["inspect", str(empty)])
    assert nothing.exit_code == 2 and "holds no *.traj.json" in nothing.output


def test_the_header_says_how_the_forwards_ran(tmp_path):
    """A session's stats count its forwards by route ("static", or why eager: runtime/step.py); the
    header shows the last turn's counts, the most first."""
    from kvagent.cli.inspect.view import summary

    turns = [
        {"step": 1, "reply": "a", "cache": {"rounds": 0, "forwards": {"prefill": 2, "static": 10}}},
        {
            "step": 2,
            "reply": "b",
            "cache": {"rounds": 1, "forwards": {"prefill": 3, "static": 40, "outgrown": 1}},
        },
    ]
    out = summary(tmp_path / "x.traj.json", {"turns": turns, "meta": {}})
    assert out["forwards"] == "static 40, prefill 3, outgrown 1"
    assert "forwards" not in summary(tmp_path / "y.traj.json", {"turns": turns[:0], "meta": {}})
