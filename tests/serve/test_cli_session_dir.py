"""`kvagent serve --session-dir` as a user runs it: SIGTERM's drain saves every session, a server
restarted on the dir continues each conversation exactly (its replies equal the library's on the
uninterrupted stream, `usage` says the session came from disk), and after `kill -9` the server
knows which conversations it lost (their markers in the dir): each is answered 409 under
kv_require_session, else restarts counted `dropped` (no crash, no 500). A `.json` damaged between
restarts neither lends its id to a new conversation nor pairs another conversation's session
with it (issue 57.3)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from kvagent.runtime import CacheConfig, Engine
from kvagent.runtime.models import load_qwen3_tokenizer

from .conftest import Replay, head_of, prompt_of

FLAGS = ["--policy", "snapkv", "--budget", "32", "--buffer", "8", "--protect", "sink"]
CONFIG = CacheConfig(policy="snapkv", budget=32, buffer=8, protect="sink")


def start(session_dir) -> tuple[subprocess.Popen, str, str]:
    cmd = [sys.executable, "-m", "kvagent", "serve", "--model", "tiny-random-qwen3", "--port", "0",
           "--log-level", "warning", "--device", "cpu", "--session-dir", str(session_dir), *FLAGS]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines = []  # what it says up to "N saved sessions found" (log lines of files set aside first)
    while not lines or "saved sessions found" not in lines[-1]:
        lines.append(proc.stdout.readline())
        assert lines[-1], "".join(lines) + proc.stdout.read()
    line = next(x for x in lines if "at http://127.0.0.1:" in x)
    found = "".join(x for x in lines if x != line)
    url = line.split("at ", 1)[1].split("/v1", 1)[0]
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.get(f"{url}/health", timeout=5)
            return proc, url, found
        except httpx.TransportError:
            assert time.monotonic() < deadline, "the server never answered"
            time.sleep(0.2)


def ask(url: str, messages: list[dict], **extra) -> httpx.Response:
    body = {"model": "tiny-random-qwen3", "messages": messages, "max_tokens": 6, "temperature": 0, **extra}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300)


@pytest.fixture
def procs():
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_sigterm_saves_sessions_a_restart_continues_them_and_kill_9_says_so(tmp_path, procs):
    tokenizer = load_qwen3_tokenizer()
    engine = Engine.load("tiny-random-qwen3", device="cpu")  # the served weights (seeded)
    convs = [[{"role": "user", "content": f"Conversation {i}: list the files."}] for i in range(2)]
    replays = [Replay(engine, CONFIG) for _ in convs]

    def turn(url: str, i: int, t: int, **extra) -> dict:
        if t:
            convs[i].append({"role": "user", "content": f"Step {t}: and now?"})
        r = ask(url, convs[i], **extra)
        assert r.status_code == 200, r.text
        body = r.json()
        g, _ = replays[i].turn(prompt_of(tokenizer, convs[i]), 6, first=head_of(tokenizer, convs[i]))
        assert body["choices"][0]["message"]["content"] == g.text, f"conversation {i} turn {t}"
        convs[i].append({"role": "assistant", "content": g.text})
        return body

    proc, url, found = start(tmp_path)
    procs.append(proc)
    assert "0 saved sessions found" in found
    for t in range(2):
        for i in range(2):
            turn(url, i, t)
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0 and "2 sessions saved in" in rest, rest
    assert len(list(tmp_path.glob("*.kvs"))) == 2

    proc, url, found = start(tmp_path)
    procs.append(proc)
    assert "2 saved sessions found" in found
    for i in range(2):
        body = turn(url, i, 2, kv_require_session=True)
        assert body["kvagent"]["status"] == "continued"
        assert body["usage"]["kv_session_restored"] == "disk"
    proc.kill()  # kill -9: both sessions were in memory only (their files go once loaded)
    proc.wait()

    proc, url, found = start(tmp_path)
    procs.append(proc)
    assert "0 saved sessions found" in found
    convs[0].append({"role": "user", "content": "Step 3: and now?"})
    r = ask(url, convs[0], kv_require_session=True)
    assert r.status_code == 409, r.text
    msg = r.json()["error"]["message"]
    assert "\n" not in msg and "lost (a server killed before it saved it)" in msg
    r = ask(url, convs[0])  # without it: a new session re-prefills the history, and says why
    assert r.status_code == 200 and r.json()["kvagent"]["reason"] == "dropped"
    assert r.json()["usage"]["kv_reprefilled_tokens"] > 0
    metrics = httpx.get(f"{url}/metrics", timeout=30).text
    assert 'kvagent_sessions_dropped_total{reason="lost"} 2.0' in metrics


@pytest.mark.slow
def test_a_damaged_marker_never_hands_a_conversation_another_ones_session(tmp_path, procs):
    """Issue 57.3's reproduction: two conversations, SIGTERM, garbage into the second's .json,
    restart, a new conversation, SIGKILL, restart, the new conversation's turn 2 under
    kv_require_session. Before: the new conversation was given the unreadable file's id, its
    marker sat beside the second conversation's session, and turn 2 was `continued` from that
    cache (logical length 95, its own history 71). Now: 409, lost; the second conversation is
    refused as unreadable; nothing is counted twice."""
    convs = [[{"role": "user", "content": f"Conversation {i}: list the files."}] for i in range(3)]

    def turn(url: str, i: int, **extra) -> httpx.Response:
        if convs[i][-1]["role"] == "assistant":
            convs[i].append({"role": "user", "content": "And now?"})
        r = ask(url, convs[i], **extra)
        if r.status_code == 200:
            convs[i].append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
        return r

    proc, url, _ = start(tmp_path)
    procs.append(proc)
    ids = [turn(url, i).json()["kvagent"]["session"] for i in range(2)]
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=180)
    (tmp_path / f"{ids[1]}.json").write_text("not json")

    proc, url, found = start(tmp_path)
    procs.append(proc)
    assert "1 saved sessions found" in found, found
    moved = [x for x in found.splitlines() if "moved to" in x]
    assert (
        len(moved) == 1 and f"{ids[1]}.kvs and {ids[1]}.json moved to {tmp_path / 'unreadable'}" in moved[0]
    )
    new = turn(url, 2).json()["kvagent"]["session"]
    assert new not in ids, f"the new conversation was given {new}, an id a file in the dir carried"
    proc.kill()
    proc.wait()

    proc, url, found = start(tmp_path)
    procs.append(proc)
    assert "1 saved sessions found" in found and "moved to" not in found, found
    r = turn(url, 2, kv_require_session=True)
    assert r.status_code == 409, f"continued another conversation's session: {r.text}"
    assert "lost (a server killed before it saved it)" in r.json()["error"]["message"]
    r = turn(url, 1, kv_require_session=True)
    assert r.status_code == 409 and "could not be read back" in r.json()["error"]["message"], r.text
    body = turn(url, 0, kv_require_session=True).json()
    assert body["kvagent"]["status"] == "continued" and body["usage"]["kv_session_restored"] == "disk"
