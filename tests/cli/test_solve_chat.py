"""`kvagent solve` and `kvagent chat` driven as a user would: subprocesses, chat through a pseudo-terminal
(stdlib `pty`, so Ctrl-C is a real byte the terminal turns into SIGINT)."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvagent.cli.settings import EngineOptions
from kvagent.testing import git_repo
from tests.helpers import call

KVAGENT = str(Path(sys.executable).with_name("kvagent"))
TINY = ["--model", "tiny-random-qwen3", "--device", "cpu"]
# A small cache that still evicts: protect=sink so the budget can sit far below the ~1.2k-token prompt.
SMALL_CACHE = ["--policy", "random", "--budget", "256", "--buffer", "32", "--protect", "sink"]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")


def env(**extra):
    # Offline: an unknown model name must fail fast instead of waiting on the network.
    return {**os.environ, "HF_HUB_OFFLINE": "1", "NO_COLOR": "1", "COLUMNS": "120", **extra}


def run_cli(*args, timeout=120):
    return subprocess.run([KVAGENT, *args], capture_output=True, text=True, timeout=timeout, env=env())


@pytest.fixture
def repo(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    root = tmp_path / "repo"
    git_repo(root, {"calc/__init__.py": "def mean(v):\n    return sum(v) / (len(v) + 1)\n"})
    return root


def one_error_line(proc, *needles):
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("kvagent: error: ") and "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in lines[-1], lines[-1]


@pytest.mark.parametrize("command", ["solve", "chat"])
@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--budget", "abc", "--policy", "random"], ["budget: 'abc' is not a number", "1024"]),
        (["--budget", "-5", "--policy", "random"], ["budget: must be >= 1 token, got -5"]),
        (["--policy", "bogus"], ["unknown policy 'bogus'", "choose one of", "snapkv"]),
    ],
    ids=["budget-abc", "budget-negative", "policy"],
)
def test_bad_options_fail_with_one_line(command, args, needles, repo):
    extra = ["--issue", "x"] if command == "solve" else []
    one_error_line(run_cli(command, "--repo", str(repo), *extra, *args), *needles)


@pytest.mark.parametrize("command", ["solve", "chat"])
def test_missing_repo(command, tmp_path):
    extra = ["--issue", "x"] if command == "solve" else []
    proc = run_cli(command, "--repo", str(tmp_path / "nope"), *extra)
    one_error_line(proc, "is not a directory", "nope")


def test_chat_bad_approval(repo):
    one_error_line(run_cli("chat", "--repo", str(repo), "--approval", "ask"), "approval: got 'ask'", "yolo")


@pytest.mark.parametrize("command", ["solve", "chat"])
def test_unknown_model(command, repo):
    extra = ["--issue", "x"] if command == "solve" else []
    proc = run_cli(command, "--repo", str(repo), *extra, "--model", "no-such-model-xyz", "--device", "cpu")
    one_error_line(proc, "model: ", "'no-such-model-xyz'", "tiny-random-qwen3")


def test_chat_budget_below_the_protected_prompt(repo):
    proc = run_cli("chat", "--repo", str(repo), *TINY, "--policy", "random", "--budget", "512")
    one_error_line(proc, "protect=prompt", "--protect sink")


def test_solve_writes_trajectory_and_patch(repo, tmp_path):
    out = tmp_path / "run"
    args = ["--issue", "mean is off by one", "--repo", str(repo), *TINY, *SMALL_CACHE]
    proc = run_cli(
        "solve", *args, "--max-steps", "2", "--max-new-tokens", "16", "--out", str(out), timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    traj = json.loads((out / "episode.traj.json").read_text())
    assert traj["exit_status"] == "step_limit" and traj["steps"] == 2
    assert traj["meta"]["cache_config"]["budget"] == 256 and traj["meta"]["model"] == "tiny-random-qwen3"
    assert all(t["cache"]["rounds"] > 0 for t in traj["turns"])
    assert (out / "patch.diff").read_text() == traj["patch"]
    assert "exit status: step_limit after 2 steps" in proc.stderr
    assert subprocess.run(["git", "-C", str(repo), "status", "--porcelain"], capture_output=True,
                          text=True).stdout == ""  # fmt: skip


class Terminal:
    """A child process on a pseudo-terminal, read with timeouts (a tiny stand-in for pexpect)."""

    def __init__(self, argv, cwd):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # child: the pty is its controlling terminal, so ^C becomes SIGINT
            os.chdir(cwd)
            os.execve(argv[0], argv, env(TERM="dumb"))
        self.text = ""
        self.status = None

    def expect(self, needle, timeout=120):
        """Read until `needle` (a str) appears after what previous expects consumed."""
        deadline = time.monotonic() + timeout
        while needle not in self.text:
            left = deadline - time.monotonic()
            if left <= 0 or not self._read(left):
                raise AssertionError(f"did not see {needle!r}; output so far:\n{self.text[-3000:]}")
        self.text = self.text[self.text.index(needle) + len(needle) :]

    def _read(self, timeout):
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return False
        try:
            data = os.read(self.fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            return False
        self.text += ANSI.sub("", data.decode("utf-8", errors="replace"))
        return True

    def send(self, text):
        os.write(self.fd, text.encode())

    def wait(self, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._read(0.2)
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(status)
                return self.status
        raise AssertionError(f"chat did not exit; output:\n{self.text[-3000:]}")

    def close(self):
        if self.status is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass
        os.close(self.fd)


@pytest.fixture
def terminal(tmp_path):
    opened = []

    def start(*args):
        t = Terminal([KVAGENT, "chat", *args], tmp_path)
        opened.append(t)
        return t

    yield start
    for t in opened:
        t.close()


def test_chat_yolo_answers_a_request_and_quits(terminal, repo, tmp_path):
    t = terminal("--repo", str(repo), *TINY, *SMALL_CACHE, "--approval", "yolo", "--max-steps", "2",
                 "--max-new-tokens", "12")  # fmt: skip
    t.expect("you> ")
    t.send("what does calc do?\r")
    t.expect("step limit (2 per request)")  # the random model never submits; the step limit returns
    t.expect("evicted")  # the cache status line
    t.expect("you> ")
    t.send("/stats\r")
    t.expect("requests 1 | steps 2")
    t.expect("you> ")
    t.send("/quit\r")
    assert t.wait() == 0
    assert subprocess.run(["git", "-C", str(repo), "status", "--porcelain"], capture_output=True,
                          text=True).stdout == ""  # fmt: skip


def test_chat_ctrl_c_stops_the_reply_not_the_chat(terminal, repo):
    # A reply of up to 20k tokens takes far longer than the test waits: only Ctrl-C can end it.
    t = terminal("--repo", str(repo), *TINY, *SMALL_CACHE, "--approval", "yolo", "--max-new-tokens", "20000")
    t.expect("you> ")
    t.send("write a long essay\r")
    time.sleep(3)  # let it load the prompt and sample for a while
    t.send("\x03")
    t.expect("interrupted; the partial reply stays in the conversation", timeout=60)
    t.expect("you> ")
    t.send("/stats\r")
    t.expect("requests 1 | steps 1")
    t.expect("you> ")
    t.send("\x04")  # Ctrl-D leaves like /quit
    assert t.wait() == 0


# ----------------------------------------------------------------------------- in-process, scripted model
ECHO = "I will look around first.\n" + call("execute_bash", cmd="echo hello-from-the-sandbox")
FINISH = call("finish", command="submit", result="done")


class Engine:
    """A scripted engine for `run_solve` (load_engine is patched to return it); `on_token(session, n)`
    is called with the count of ids the session has handed out, to act while a reply is sampled."""

    n_layers, name = 2, "scripted"

    def __init__(self, tokenizer, replies, on_token=None):
        from kvagent.testing import ScriptedEngine

        self._scripted = ScriptedEngine(tokenizer, lambda config: replies)
        self.tokenizer, self.on_token = tokenizer, on_token

    def session(self, config):
        s = self._scripted.session(config)
        if self.on_token is not None:
            s.after_token = lambda n: self.on_token(s, n)
        return s

    def plan(self, config):
        return self._scripted.plan(config)


CACHE = dict(policy="full", budget=None, buffer=32, mode="persistent", scope="prefill+decode",
             protect="prompt", window=16, seed=0, policy_arg=None)  # fmt: skip
AGENT = dict(max_steps=5, max_new_tokens=256, context_limit=8192, temperature=0.0, prompt_style="repo_first",
             seed=0)  # fmt: skip


def solve_in_process(monkeypatch, repo, out, engine, console=None):
    import io

    from rich.console import Console

    from kvagent.cli import solve

    monkeypatch.setattr(solve, "load_engine", lambda *a, **k: engine)
    console = console or Console(file=io.StringIO(), width=120, color_system=None)
    result = solve.run_solve(issue="mean is off by one", repo=str(repo), image=None, engine=EngineOptions(model="scripted"),
                             cache=CACHE, agent=AGENT, out=str(out), console=console)  # fmt: skip
    return result, console


def test_interrupted_solve_keeps_a_partial_trajectory(monkeypatch, repo, tmp_path, tokenizer):
    first = len(tokenizer.encode(ECHO, add_special_tokens=False))

    def ctrl_c(session, n):
        if n == first + 3:  # a few tokens into the second reply
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        solve_in_process(monkeypatch, repo, tmp_path / "run", Engine(tokenizer, [ECHO, FINISH], ctrl_c))
    traj = json.loads((tmp_path / "run" / "episode.traj.json").read_text())
    assert traj["exit_status"] == "interrupted" and traj["steps"] == 2
    assert traj["turns"][0]["call"]["name"] == "execute_bash"
    assert "hello-from-the-sandbox" in traj["turns"][0]["observation"]
    assert (tmp_path / "run" / "patch.diff").read_text() == traj["patch"]


def test_missing_image_fails_before_the_model_loads(monkeypatch):
    from kvagent.cli import solve
    from kvagent.errors import KvagentError
    from kvagent.sandbox import images

    def no_model(*a, **k):
        raise AssertionError("the model was loaded before the image was checked")

    monkeypatch.setattr(solve, "load_engine", no_model)
    monkeypatch.setattr(images, "image_exists", lambda tag, client=None: False)
    with pytest.raises(KvagentError, match="docker image 'no-such-image:1' not found locally"):
        solve.run_solve(
            issue="x",
            repo=None,
            image="no-such-image:1",
            engine=EngineOptions(model="m"),
            cache=CACHE,
            agent=AGENT,
        )


def test_solve_streams_replies_and_a_status_line_per_step_while_generating(
    monkeypatch, repo, tmp_path, tokenizer
):
    first = len(tokenizer.encode(ECHO, add_special_tokens=False))
    seen = {}

    def snapshot(session, n):
        if n == first + 2:  # while the second reply is being sampled
            seen["text"] = console.file.getvalue()

    import io

    from rich.console import Console

    console = Console(file=io.StringIO(), width=200, color_system=None)
    result, _ = solve_in_process(
        monkeypatch, repo, tmp_path / "run", Engine(tokenizer, [ECHO, FINISH], snapshot), console=console
    )
    assert result.exit_status == "submitted"
    during = seen["text"]
    assert "I will look around first." in during  # step 1's reply, as it was sampled
    assert re.search(
        r"step 1/5 \| tokens [\d,]+ \| cache [\d,]+/dense \| rounds 0 \| evicted 0 .*elapsed", during
    )
    assert "hello-from-the-sandbox" in during  # the observation
    assert "step 2/5" in during  # the second step has begun
    assert "step 2/5 |" not in during  # ... and its status line comes when its reply ends
    end = console.file.getvalue()
    assert "step 2/5 |" in end and "end: submitted after 2 steps" in end


def test_chat_repo_defaults_to_the_current_directory(monkeypatch, repo):
    from typer.testing import CliRunner

    from kvagent.cli.app import app
    from kvagent.cli.chat import run as chat

    seen = {}
    monkeypatch.setattr(chat, "run_chat", lambda **kw: seen.update(kw))
    monkeypatch.chdir(repo)
    result = CliRunner().invoke(app, ["chat", "--model", "tiny-random-qwen3"])
    assert result.exit_code == 0, result.output
    assert Path(seen["repo"]).resolve() == repo.resolve()


def test_the_stream_needs_no_agent_events(tokenizer, tmp_path):
    """As `eval` with one worker hooks it up: only the engine is wrapped (its runner passes no on_event)."""
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from kvagent.agent.solve import solve_episode
    from kvagent.cli.ui import EpisodeStream
    from kvagent.runtime import CacheConfig
    from kvagent.testing import ScriptedEngine

    class Env:
        workdir = "/testbed"

        def run_tool(self, name, params, timeout=90):
            return SimpleNamespace(exit_code=0, output="ok", timed_out=False)

        def diff(self):
            return ""

    console = Console(file=io.StringIO(), width=200, color_system=None)
    stream = EpisodeStream(console, max_steps=3)
    seen = []
    update = stream.around_runs(lambda *args: seen.append(args[0]), lambda: "TABLE-OF-RUNS")
    run = SimpleNamespace(run_id="calc-1__random__K256__s0")
    update("start", run, None)
    engine = ScriptedEngine(tokenizer, lambda config: [ECHO, FINISH])
    config = CacheConfig(policy="random", budget=256, buffer=32, protect="sink")
    result = solve_episode(stream.wrap(engine), Env(), "mean is off", cache_config=config)
    update("done", run, {"run_id": run.run_id})
    text = console.file.getvalue()
    assert result.exit_status == "submitted" and engine.sessions == 1 and seen == ["start", "done"]
    assert (
        text.index("calc-1__random__K256__s0") < text.index("prompt ") < text.index("I will look around")
        < text.index("TABLE-OF-RUNS")
    )  # fmt: skip
    assert re.search(r"step 1/3 \| tokens [\d,]+ \| cache [\d,]+/256\+64 \| .*elapsed", text)
    assert "step 2/3 |" in text and "<function=finish>" in text
