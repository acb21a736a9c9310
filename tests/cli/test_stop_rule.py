"""`solve` and `chat` ask the model with the same stop strings: the scaffold's one rule
(`</function>` under kvagent's protocol, none under R2E-Gym's, where a reply runs to end of turn).
Both commands run in-process as the CLI runs them, with a recording engine in place of a model."""

from __future__ import annotations

import builtins

import pytest

from kvagent.cli.settings import EngineOptions
from kvagent.testing import ScriptedEngine, git_repo
from tests.helpers import SUBMIT

STOPS = {"kvagent": ["</function>"], "r2egym": []}


class RecordingEngine(ScriptedEngine):
    n_layers = 2

    def __init__(self, tokenizer):
        super().__init__(tokenizer, lambda config: [SUBMIT])
        self.made = []

    def session(self, config):
        s = super().session(config)
        self.made.append(s)
        return s

    def stops(self):
        return [c["stop"] for s in self.made for c in s.calls]


def options(scaffold):
    """The cache and agent options as the commands get them (every other option at its default)."""
    cache = dict(
        policy="full", budget=None, buffer=128, mode="persistent", scope="prefill+decode", protect="prompt",
        window=16, seed=0, policy_arg=None, head_budget="uniform",
    )  # fmt: skip
    return dict(cache=cache, agent=dict(max_steps=3, scaffold=scaffold))


@pytest.fixture
def repo(tmp_path):
    git_repo(tmp_path / "repo", {"a.py": "x = 1\n"})
    return tmp_path / "repo"


@pytest.mark.parametrize("scaffold", ["kvagent", "r2egym"])
def test_solve_uses_the_scaffolds_stop_rule(scaffold, repo, tmp_path, tokenizer, monkeypatch):
    from kvagent.cli import solve

    engine = RecordingEngine(tokenizer)
    monkeypatch.setattr(solve, "load_engine", lambda *a, **k: engine)
    solve.run_solve(
        issue="x",
        repo=str(repo),
        image=None,
        engine=EngineOptions(model="m"),
        out=str(tmp_path / "out"),
        **options(scaffold),
    )
    assert engine.stops() == [STOPS[scaffold]]


@pytest.mark.parametrize("scaffold", ["kvagent", "r2egym"])
def test_chat_uses_the_scaffolds_stop_rule(scaffold, repo, tokenizer, monkeypatch):
    from kvagent.cli import common
    from kvagent.cli.chat import run as chat

    engine = RecordingEngine(tokenizer)
    monkeypatch.setattr(common, "load_engine", lambda *a, **k: engine)
    lines = iter(["fix it"])

    def read_line(prompt=""):
        try:
            return next(lines)
        except StopIteration:
            raise EOFError from None

    monkeypatch.setattr(builtins, "input", read_line)
    chat.run_chat(repo=str(repo), engine=EngineOptions(model="m"), approval="yolo", **options(scaffold))
    assert engine.stops() == [STOPS[scaffold]]
