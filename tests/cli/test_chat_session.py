"""`kvagent chat --session FILE`: a chat saved when it ends and resumed by the next `kvagent chat` with
the same file answers the next request exactly as if it had never stopped (same tokens, same
sampled replies from the restored generator, same logits), with the bounded cache it had."""

from __future__ import annotations

import io
import shutil

import pytest
import torch
from rich.console import Console

from kvagent.cli.chat.resume import sidecar
from kvagent.cli.chat.run import run_chat
from kvagent.cli.settings import EngineOptions
from kvagent.errors import ConfigError
from kvagent.testing import git_repo

CACHE = {"policy": "h2o", "budget": "96", "buffer": 16, "protect": "sink"}
AGENT = {"max_steps": 2, "max_new_tokens": 12}  # the random model never submits: 2 replies a request


@pytest.fixture
def repo(tmp_path):
    if shutil.which("git") is None or shutil.which("bwrap") is None:
        pytest.skip("git and bwrap are needed for a local sandbox")
    root = tmp_path / "repo"
    git_repo(root, {"calc/__init__.py": "def mean(v):\n    return sum(v) / (len(v) + 1)\n"})
    return root


def chat(monkeypatch, repo, lines, session_file=None, model="tiny-random-qwen3"):
    feed = iter(lines)

    def read_line(prompt=""):
        try:
            return next(feed)
        except StopIteration:
            raise EOFError from None

    monkeypatch.setattr("builtins.input", read_line)
    return run_chat(repo=str(repo), engine=EngineOptions(model=model, device="cpu"), cache=CACHE, agent=AGENT,
                    approval="yolo",
                    console=Console(file=io.StringIO()), session_file=session_file)  # fmt: skip


@pytest.mark.parametrize("model", ["tiny-random-qwen3", pytest.param("smollm2", marks=pytest.mark.slow)])
def test_a_chat_saved_at_quit_continues_exactly(monkeypatch, repo, tmp_path, model):
    path = tmp_path / "chat.kvs"
    first = chat(monkeypatch, repo, ["what does calc do?", "/quit"], session_file=str(path), model=model)
    assert path.exists() and sidecar(path).exists()
    assert first.session.stats.rounds > 0, "the saved cache must have evicted"
    resumed = chat(monkeypatch, repo, ["now fix it", "/quit"], session_file=str(path), model=model)
    # the reference: the first chat's objects asked the same (its replies never reach the sandbox)
    first.ask("now fix it")
    assert resumed.session.history == first.session.history
    assert [t.reply for t in resumed.agent.turns] == [t.reply for t in first.agent.turns]
    assert torch.equal(resumed.session.last_logits, first.session.last_logits)
    for a, b in zip(resumed.session.kept_positions(), first.session.kept_positions(), strict=True):
        assert torch.equal(a, b)
    assert resumed.agent.requests == 2


def test_another_models_chat_file_is_refused(monkeypatch, repo, tmp_path):
    path = tmp_path / "chat.kvs"
    chat(monkeypatch, repo, ["hello", "/quit"], session_file=str(path))
    with pytest.raises(ConfigError, match="saved from model"):
        chat(monkeypatch, repo, ["again", "/quit"], session_file=str(path), model="tiny-random-llama")
