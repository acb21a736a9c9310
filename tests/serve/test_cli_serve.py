"""`kvagent serve` as a user runs it: bad flags are one line and exit 2 before any model loads; a
real process on a free port answers, and SIGTERM drains it (it stops accepting, the request in
flight finishes, one past the drain timeout ends with finish_reason "abort") and it exits 0."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from kvagent.cli.app import app
from kvagent.cli.exits import run_app


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--port", "70000"], ["port:", "1-65535"]),
        (["--kv-memory", "0"], ["kv-memory:", "> 0"]),
        (["--max-batch", "0"], ["max-batch:", ">= 1"]),
        (["--policy", "snapkv"], ["budget:", "--budget"]),
        (["--log-level", "loud"], ["log-level:", "warning"]),
        (["--max-queue", "-1"], ["max-queue:"]),
    ],
)
def test_bad_flags_are_one_line_before_the_model_loads(args, words, capsys, monkeypatch):
    import kvagent.cli.common

    monkeypatch.setattr(
        kvagent.cli.common, "load_engine", lambda *a, **k: pytest.fail("the model was loaded")
    )
    code = run_app(app, ["serve", "--model", "tiny-random-qwen3", *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("kvagent: error: "), err
    assert all(w in err[0] for w in words), err[0]


def test_a_taken_port_is_one_line(capsys, monkeypatch):
    import kvagent.cli.common

    monkeypatch.setattr(
        kvagent.cli.common, "load_engine", lambda *a, **k: pytest.fail("the model was loaded")
    )
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        code = run_app(app, ["serve", "--model", "tiny-random-qwen3", "--port", str(taken.getsockname()[1])])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "pick another --port" in err and "\n" not in err


def _stream(url: str, max_tokens: int, out: dict) -> None:
    body = {"model": "tiny-random-qwen3", "messages": [{"role": "user", "content": "count"}],
            "max_tokens": max_tokens, "ignore_eos": True, "stream": True}  # fmt: skip
    chunks, out["done"] = [], False
    try:
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=300) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    chunks.append(json.loads(line[6:]))
                    out["first"].set()
                out["done"] = out["done"] or line == "data: [DONE]"
    except httpx.HTTPError as e:
        out["error"] = e
    out["chunks"] = chunks
    out["first"].set()


def test_sigterm_drains_and_exits_zero(tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "kvagent", "serve", "--model", "tiny-random-qwen3", "--port", "0",
           "--max-batch", "2", "--drain-timeout", "15", "--log-level", "warning", "--device", "cpu"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        line = proc.stdout.readline()  # printed once the port is bound and the model loaded
        assert "at http://127.0.0.1:" in line, line + proc.stdout.read()
        url = line.split("at ", 1)[1].split("/v1", 1)[0]
        deadline = time.monotonic() + 60
        while True:  # uvicorn starts serving just after the line
            try:
                assert httpx.get(f"{url}/health", timeout=5).json() == {"status": "ok"}
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the server never answered"
                time.sleep(0.2)
        short, long = {"first": threading.Event()}, {"first": threading.Event()}
        threads = [threading.Thread(target=_stream, args=(url, 30, short)),
                   threading.Thread(target=_stream, args=(url, 60_000, long))]  # fmt: skip
        for t in threads:
            t.start()
        assert short["first"].wait(120) and long["first"].wait(120)
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(timeout=180)
        rest, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, rest
    assert "stopped after" in rest
    finish = [c["choices"][0]["finish_reason"] for c in short["chunks"] if c["choices"]]
    assert short["done"] and finish[-1] == "length", short  # in flight: it finished
    finish = [c["choices"][0]["finish_reason"] for c in long["chunks"] if c["choices"]]
    assert long["done"] and finish[-1] == "abort", (
        long.get("error"),
        long["done"],
        finish[-3:],
        len(long["chunks"]),
        rest,
    )
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/health", timeout=5)
