#!/usr/bin/env python
"""Kill `kvagent solve` and `kvagent eval` with SIGTERM and SIGKILL at random (seeded) moments,
rerun, and check nothing is lost or left behind (issue 16.3).

    .venv/bin/python scripts/kill_soak.py --kills 20 --seed 0 --backend local
    .venv/bin/python scripts/kill_soak.py --kills 20 --backend both   # + docker (kvagent/base image)

Each round starts one command (solve or eval, local sandbox or a container of a locally built
image) on the tiny random model, waits a random moment (often until its sandbox exists, sometimes
not), sends SIGTERM or SIGKILL and waits for it to end. After a SIGTERM the process must exit by
itself within a bound and leave no sandbox dir and no container; after a SIGKILL leftovers are
allowed until the next kvagent process starts (its startup sweep removes them). At the end every
eval is rerun to completion and each solve once more, then the check: every planned run recorded
exactly once in runs.jsonl, `kvagent report` exits 0, no sandbox dir under the children's TMPDIR
and no container owned by any process the script started. Exit 0 when all holds, 1 otherwise.

    .venv/bin/python scripts/kill_soak.py --serve --kills 6 --conversations 4 --turns 6 --seed 0

`--serve` soaks `kvagent serve --session-dir` instead (issue 57.3): conversations run against a
server on the tiny random model (tiny --kv-memory: every idle session goes to disk), the server is
killed (SIGTERM or SIGKILL, seeded) after a random number of turns and restarted on the same dir,
and between restarts files are damaged at random (a byte flipped in a session's data, a session
cut short, a `.json` of garbage, another conversation's session copied over one). Every request
sends kv_require_session. Checked: after each kill no `.kvs` / `.json` is half-written (each reads
back whole, checksum included) and the temp files a killed writer left are gone once a server
restarts; every answer is a 200 that continued the conversation's session with a logical length
of exactly its prompt plus its reply (never re-prefilled, never another conversation's cache), or
a 409 naming one cause, and only where a SIGKILL or damage to its files could have cost it its
session (the cause named: `lost` after a kill, unreadable after damage); one whose session's files
were damaged is never continued (the damage must be seen); a conversation answered
409 ends and a new one takes its place. At the end every conversation is replayed alone on a fresh
server without a session dir and each recorded reply must equal that solo run's.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KVAGENT = str(Path(sys.executable).with_name("kvagent"))
BASE_IMAGE = "kvagent/base:bookworm"
SANDBOX_PREFIX = "kvagent-sbx-"
TERM_EXIT_S = 60.0  # a SIGTERM'd run must be gone by then (its current model step included)
IID = "soak__calc-1"
MODEL = ["--model", "tiny-random-qwen3", "--device", "cpu", "--max-new-tokens", "8", "--temperature", "0"]


def make_fixture(ws: Path, image: str | None) -> dict:
    from kvagent.testing import calc_record

    repos = ws / "repos"
    record = calc_record(repos, IID, repo="soak/calc")
    if image:
        record["image"] = image
    (ws / "dataset.json").write_text(json.dumps([record]))
    return {"repos": repos, "repo": repos / IID}


def build_image(ws: Path, repo: Path, tag: str) -> None:
    """FROM the registry-free base image, the fixture at /testbed (built with the network off)."""
    from kvagent.sandbox import ensure_base_image
    from kvagent.sandbox.images import build_image as docker_build

    ensure_base_image(BASE_IMAGE)
    ctx = ws / "image"
    shutil.copytree(repo, ctx / "testbed", symlinks=True)
    (ctx / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\nCOPY testbed /testbed\nWORKDIR /testbed\n")
    docker_build(ctx, tag, ws / "image-build.log")


class Soak:
    def __init__(self, ws: Path, backends: list[str], image: str | None, seed: int):
        self.ws, self.backends, self.image = ws, backends, image
        self.rng = random.Random(seed)
        self.tmp = ws / "tmp"  # the children's TMPDIR: their sandbox dirs land here only
        self.tmp.mkdir()
        self.pids: list[int] = []
        self.failures: list[str] = []
        self.env = {**os.environ, "TMPDIR": str(self.tmp), "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"}

    # ------------------------------------------------------------------ the commands
    def argv(self, command: str, backend: str) -> list[str]:
        if command == "solve":
            where = (
                ["--repo", str(self.ws / "repos" / IID)] if backend == "local" else ["--image", self.image]
            )
            return [KVAGENT, "solve", "--issue", "add() subtracts", *where, *MODEL, "--max-steps", "3",
                    "--out", str(self.ws / f"solve-{backend}")]  # fmt: skip
        env = (
            ["--env", "local", "--repos", str(self.ws / "repos")]
            if backend == "local"
            else ["--env", "docker"]
        )
        grade = ["--grade"] if backend == "local" else ["--no-grade"]  # the base image has no pytest
        return [KVAGENT, "eval", "--dataset", str(self.ws / "dataset.json"), *env, *grade, *MODEL,
                "--policies", "full,random", "--modes", "persistent", "--budgets", "2048", "--seeds", "0,1",
                "--max-steps", "2", "--out", str(self.run_dir(backend))]  # fmt: skip

    def run_dir(self, backend: str) -> Path:
        return self.ws / f"eval-{backend}"

    def start(self, command: str, backend: str) -> subprocess.Popen:
        log = open(self.ws / "logs" / f"{len(self.pids):03d}-{command}-{backend}.log", "w")  # noqa: SIM115
        proc = subprocess.Popen(self.argv(command, backend), env=self.env, stdout=log, stderr=log)
        self.pids.append(proc.pid)
        return proc

    # ------------------------------------------------------------------ what a process leaves
    def dirs_of(self, pid: int | None = None) -> list[str]:
        mark = f"{SANDBOX_PREFIX}{pid}-" if pid else SANDBOX_PREFIX
        return sorted(p.name for p in self.tmp.iterdir() if p.name.startswith(mark))

    def containers_of(self, pids: list[int]) -> list[str]:
        if "docker" not in self.backends:
            return []
        import docker

        from kvagent.sandbox import owner

        found = []
        for c in docker.from_env().containers.list(all=True, filters={"label": owner.LABEL}):
            rec = owner.owner_of_labels(c.labels or {})
            if rec and rec.host == socket.gethostname() and rec.pid in pids:
                found.append(c.name)
        return found

    def has_sandbox(self, pid: int, backend: str) -> bool:
        return bool(self.dirs_of(pid)) if backend == "local" else bool(self.containers_of([pid]))

    # ------------------------------------------------------------------ one round
    def round(self, i: int) -> None:
        command = self.rng.choice(["solve", "eval"])
        backend = self.rng.choice(self.backends)
        sig = self.rng.choice([signal.SIGTERM, signal.SIGKILL])
        early = self.rng.random() < 0.25  # before any sandbox: model loading, planning
        delay = self.rng.uniform(0.2, 4.0)
        proc = self.start(command, backend)
        start = time.monotonic()
        if not early:  # wait for its sandbox (or its end), then a random moment more
            while (
                proc.poll() is None
                and not self.has_sandbox(proc.pid, backend)
                and time.monotonic() - start < 180
            ):
                time.sleep(0.1)
        time.sleep(delay)
        when = time.monotonic() - start
        if proc.poll() is None:
            proc.send_signal(sig)
        try:
            code = proc.wait(timeout=TERM_EXIT_S)
        except subprocess.TimeoutExpired:
            self.fail(f"round {i}: {command} ({backend}) still running {TERM_EXIT_S:.0f}s after {sig.name}")
            proc.kill()
            code = proc.wait()
        left = self.dirs_of(proc.pid) + self.containers_of([proc.pid])
        print(f"round {i:2d}: {command:5s} {backend:6s} {sig.name:7s} at {when:5.1f}s -> exit {code}"
              f"{'; left: ' + ', '.join(left) if left else ''}", flush=True)  # fmt: skip
        if sig == signal.SIGTERM and left:
            self.fail(f"round {i}: SIGTERM left {left}")

    def fail(self, message: str) -> None:
        print(f"FAIL {message}", flush=True)
        self.failures.append(message)

    # ------------------------------------------------------------------ reruns and the final check
    def finish(self) -> None:
        for backend in self.backends:
            for command in ("eval", "solve"):
                proc = self.start(command, backend)
                code = proc.wait(timeout=900)
                print(f"rerun: {command} {backend} -> exit {code}", flush=True)
                if code != 0:
                    self.fail(f"rerun of {command} ({backend}) exited {code}; see {self.ws / 'logs'}")
        for backend in self.backends:
            self.check_run_dir(backend)
        # The reruns' startup sweeps must have removed what every SIGKILL left.
        time.sleep(1.0)
        if self.dirs_of():
            self.fail(f"sandbox dirs left: {self.dirs_of()}")
        if self.containers_of(self.pids):
            self.fail(f"containers left: {self.containers_of(self.pids)}")

    def check_run_dir(self, backend: str) -> None:
        from kvagent.evals.runner import plan_runs
        from kvagent.evals.stats import is_infra_error

        run_dir = self.run_dir(backend)
        planned = {r.run_id for r in plan_runs([IID], ["full", "random"], ["persistent"], [2048], [0, 1])}
        lines = [json.loads(x) for x in (run_dir / "runs.jsonl").read_text().splitlines() if x.strip()]
        # Records of infrastructure errors may repeat (a retry follows them); a finished run must not.
        ids = [r["run_id"] for r in lines if not is_infra_error(r)]
        dupes = sorted({x for x in ids if ids.count(x) > 1})
        if dupes:
            self.fail(f"{run_dir}: runs recorded more than once: {dupes}")
        if set(ids) != planned:
            self.fail(f"{run_dir}: recorded {sorted(set(ids))}, planned {sorted(planned)}")
        report = subprocess.run(
            [KVAGENT, "report", str(run_dir)], env=self.env, capture_output=True, text=True
        )
        if report.returncode != 0:
            self.fail(f"kvagent report {run_dir} exited {report.returncode}: {report.stderr.strip()[-300:]}")
        print(f"{run_dir.name}: {len(ids)} runs recorded once each "
              f"({len(lines) - len(ids)} infra-error record(s)); report exit {report.returncode}", flush=True)  # fmt: skip


SERVE = ["--model", "tiny-random-qwen3", "--device", "cpu", "--host", "127.0.0.1", "--port", "0",
         "--log-level", "warning", "--policy", "snapkv", "--budget", "32", "--buffer", "8", "--protect", "sink",
         "--max-batch", "2", "--drain-timeout", "10"]  # fmt: skip
CAUSES = {  # the 409's phrase for each cause (kvagent/serve/conversations.py)
    "memory": "dropped for memory",
    "lost": "lost (a server killed",
    "unreadable": "could not be read back",
    "unknown": "no session on this server",
}


class Conversation:
    def __init__(self, index: int) -> None:
        self.index = index
        self.messages: list[dict] = [{"role": "system", "content": f"You are agent {index}."}]
        self.replies: list[str] = []  # the replies it got, one a turn
        self.sid: str | None = None  # its session's id, as the server last named it
        self.killed = False  # a SIGKILL since its last answer: its session may be gone
        self.damaged = ""  # since its last answer: "own" (its session's files damaged) or "maybe"
        self.lost: str | None = None  # the 409's message that ended it

    def next_user(self) -> None:
        t = len(self.replies)
        self.messages.append(
            {
                "role": "user",
                "content": f"Conversation {self.index}, step {t}: run the tests in pkg{self.index}.",
            }
        )


class ServeSoak:
    """Conversations against a server killed and restarted on one --session-dir (see the docstring)."""

    def __init__(self, ws: Path, seed: int, n: int, turns: int) -> None:
        import threading

        self.ws, self.rng, self.turns = ws, random.Random(seed), turns
        self.dir = ws / "sessions"
        self.env = {**os.environ, "HF_HUB_OFFLINE": "1", "NO_COLOR": "1", "PYTHONUNBUFFERED": "1"}
        self.failures: list[str] = []
        self.convs: list[Conversation] = []
        self.active = [self.new_conversation() for _ in range(n)]
        self.url: str | None = None
        self.cond = threading.Condition()  # guards url, done and the turn counter
        self.turns_done = 0
        self.final = False  # the last server: conversations finish, none start
        self.done = False
        self.damaged: set[str] = set()  # files damaged on purpose (not half-written ones)
        self.starts = 0

    def new_conversation(self) -> Conversation:
        conv = Conversation(len(self.convs))
        self.convs.append(conv)
        return conv

    def fail(self, message: str) -> None:
        print(f"FAIL {message}", flush=True)
        self.failures.append(message)

    # ------------------------------------------------------------------ the server
    def start(self, session_dir: Path | None) -> subprocess.Popen:
        self.starts += 1
        log_path = self.ws / "logs" / f"serve-{self.starts:02d}.log"
        extra = ["--session-dir", str(session_dir), "--kv-memory", "0.000001"] if session_dir else []
        tmp_before = {p.name for p in session_dir.glob(".*.tmp")} if session_dir else set()
        with open(log_path, "w") as log:
            proc = subprocess.Popen([KVAGENT, "serve", *SERVE, *extra], env=self.env, stdout=log,
                                    stderr=subprocess.STDOUT)  # fmt: skip
        deadline = time.monotonic() + 180
        while "saved sessions found" not in (text := log_path.read_text()) and (
            session_dir or "/v1 (" not in text
        ):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start; see {log_path}:\n{text[-2000:]}")
            time.sleep(0.1)
        url = text.split(" at ", 1)[1].split("/v1", 1)[0]
        left = tmp_before & {p.name for p in session_dir.glob(".*.tmp")} if session_dir else set()
        if left:
            self.fail(f"start {self.starts}: a killed writer's temp files were not removed: {sorted(left)}")
        import httpx

        while True:
            try:
                httpx.get(f"{url}/health", timeout=5)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        proc.url = url  # type: ignore[attr-defined]
        return proc

    def ask(self, url: str, conv: Conversation) -> tuple[int, dict]:
        import httpx

        body = {"model": "tiny-random-qwen3", "messages": conv.messages, "max_tokens": 6, "temperature": 0,
                "kv_require_session": True}  # fmt: skip
        r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
        return r.status_code, r.json()

    # ------------------------------------------------------------------ the clients
    def client(self, slot: int) -> None:
        import httpx

        while True:
            with self.cond:
                conv = self.active[slot]
                if conv.lost is not None or len(conv.replies) >= self.turns:
                    if not self.final:  # the next conversation in this slot
                        conv = self.active[slot] = self.new_conversation()
                    else:  # the last server: this slot is done
                        self.cond.wait_for(lambda: self.done)
                while self.url is None and not self.done:
                    self.cond.wait()
                if self.done:
                    return
                url = self.url
            if conv.messages[-1]["role"] != "user":
                conv.next_user()
            try:
                status, body = self.ask(url, conv)
            except (httpx.TransportError, ValueError):  # killed under it: ask again on the next server
                with self.cond:
                    while self.url == url and not self.done:
                        self.cond.wait()
                continue
            if status in (429, 503):
                time.sleep(0.05)
                continue
            self.answer(conv, status, body)
            with self.cond:
                self.turns_done += 1
                self.cond.notify_all()

    def answer(self, conv: Conversation, status: int, body: dict) -> None:
        name, t = f"conversation {conv.index} turn {len(conv.replies)}", len(conv.replies)
        if status == 409:
            msg = body["error"]["message"]
            named = [c for c, phrase in CAUSES.items() if phrase in msg]
            allowed = {"lost"} if conv.killed else set()
            allowed |= {"unreadable", "unknown"} if conv.damaged else set()
            if len(named) != 1 or named[0] not in allowed:
                self.fail(f"{name}: 409 {named} where it could only be {sorted(allowed)}: {msg}")
            conv.lost = msg
            print(f"  {name}: 409 ({named})", flush=True)
            return
        if status != 200:
            self.fail(f"{name}: {status} {body}")
            conv.lost = f"status {status}"
            return
        info, usage, choice = body["kvagent"], body["usage"], body["choices"][0]
        if choice["finish_reason"] == "abort":
            return  # cut by a drain: asked again
        if t and (info["status"], info["reason"]) != ("continued", "continued"):
            self.fail(f"{name}: {info['status']} ({info['reason']}) without a 409: silently re-prefilled")
        if t and conv.damaged == "own":
            self.fail(f"{name}: continued from {conv.sid}, whose files were damaged: the damage went unseen")
        if info["logical_length"] != usage["prompt_tokens"] + usage["completion_tokens"]:
            self.fail(f"{name}: its session holds {info['logical_length']} tokens, its prompt and reply "
                      f"{usage['prompt_tokens'] + usage['completion_tokens']}: another conversation's cache")  # fmt: skip
        conv.replies.append(choice["message"]["content"] or "")
        conv.messages.append({"role": "assistant", "content": conv.replies[-1]})
        conv.sid, conv.killed, conv.damaged = info["session"], False, ""

    # ------------------------------------------------------------------ kills, files, damage
    def files_whole(self) -> None:
        """After a kill: every session file and marker reads back whole (atomic writes)."""
        from kvagent.errors import ConfigError
        from kvagent.runtime import persist

        for path in sorted(p for p in self.dir.glob("*.kvs") if p.name not in self.damaged):
            try:
                persist.read(path)
            except ConfigError as e:
                self.fail(f"half-written session file after a kill: {e}")
        for path in sorted(p for p in self.dir.glob("*.json") if p.name not in self.damaged):
            try:
                json.loads(path.read_text())
            except ValueError as e:
                self.fail(f"half-written {path.name} after a kill: {e}")

    def damage(self) -> None:
        """Damage 0-2 saved sessions' files at random; their conversations are marked."""
        kvs = sorted(self.dir.glob("*.kvs"))
        sides = sorted(self.dir.glob("*.json"))
        for _ in range(self.rng.randint(0, 2)):
            how = self.rng.choice(["flip", "cut", "garbage", "swap"])
            pool = sides if how == "garbage" else kvs
            if not pool or (how == "swap" and len(kvs) < 2):
                continue
            path = self.rng.choice(pool)
            data = bytearray(path.read_bytes())
            if how == "flip":
                n = int.from_bytes(data[:8], "little")
                if len(data) > 8 + n:
                    data[self.rng.randrange(8 + n, len(data))] ^= 1 << self.rng.randrange(8)
                path.write_bytes(bytes(data))
            elif how == "cut":
                path.write_bytes(bytes(data[: self.rng.randrange(len(data))]))
            elif how == "garbage":
                path.write_bytes(bytes(self.rng.randrange(256) for _ in range(self.rng.randint(1, 64))))
            else:
                other = self.rng.choice([k for k in kvs if k != path])
                shutil.copyfile(other, path)
            self.damaged.add(path.name)
            sid = path.stem
            # its conversation; or one whose first answer was lost in a kill (its id unknown here)
            hit = [c.index for c in self.convs if c.sid == sid or (c.sid is None and len(c.messages) > 1)]
            for c in self.convs:
                if c.index in hit:
                    c.damaged = "own" if c.sid == sid else c.damaged or "maybe"
            print(f"  damaged {path.name} ({how}): conversations {hit}", flush=True)

    def run(self, kills: int) -> None:
        import threading

        self.dir.mkdir()
        threads = [
            threading.Thread(target=self.client, args=(i,), daemon=True) for i in range(len(self.active))
        ]
        for th in threads:
            th.start()
        for k in range(kills + 1):
            proc = self.start(self.dir)
            with self.cond:
                self.final = k == kills
                self.url, start_turns = proc.url, self.turns_done  # type: ignore[attr-defined]
                self.cond.notify_all()
                target = start_turns + self.rng.randint(1, 2 * len(self.active) + 2)
                if not self.final and not self.cond.wait_for(
                    lambda t=target: self.turns_done >= t, timeout=600
                ):
                    self.fail(f"server {k}: no turns answered in 600s")
                if self.final:  # every active conversation finishes its turns (or is answered 409)
                    self.cond.wait_for(
                        lambda: all(len(c.replies) >= self.turns or c.lost for c in self.active), timeout=600
                    )
            if self.final:
                sig = signal.SIGTERM
            else:
                time.sleep(self.rng.uniform(0.0, 0.3))  # a random point: often mid-request
                sig = self.rng.choice([signal.SIGTERM, signal.SIGKILL])
            proc.send_signal(sig)
            with self.cond:
                self.url = None
                self.cond.notify_all()
            code = proc.wait(timeout=120)
            print(
                f"server {k}: {sig.name} after {self.turns_done - start_turns} turns -> exit {code}",
                flush=True,
            )
            if sig == signal.SIGTERM and code != 0:
                self.fail(f"server {k}: exit {code} after SIGTERM; see {self.ws / 'logs'}")
            if sig == signal.SIGKILL:
                for c in self.convs:
                    c.killed = True
            self.files_whole()
            if k < kills:
                self.damage()
        with self.cond:
            self.done = True
            self.cond.notify_all()
        for th in threads:
            th.join(timeout=300)

    def replay_alone(self) -> None:
        """Every conversation's recorded replies against one solo run each (a fresh server)."""
        proc = self.start(None)
        try:
            for conv in self.convs:
                solo = Conversation(conv.index)
                for t, reply in enumerate(conv.replies):
                    solo.next_user()
                    status, body = self.ask(proc.url, solo)  # type: ignore[attr-defined]
                    want = body["choices"][0]["message"]["content"] or "" if status == 200 else f"<{status}>"
                    if want != reply:
                        self.fail(f"conversation {conv.index} turn {t}: {reply!r}, served alone {want!r}")
                        break
                    solo.replies.append(reply)
                    solo.messages.append({"role": "assistant", "content": reply})
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)


def serve_soak(ws: Path, seed: int, kills: int, n: int, turns: int) -> int:
    started = time.monotonic()
    soak = ServeSoak(ws, seed, n, turns)
    soak.run(kills)
    soak.replay_alone()
    took = time.monotonic() - started
    done = sum(len(c.replies) for c in soak.convs)
    lost = sum(c.lost is not None for c in soak.convs)
    summary = f"{kills} kills, {len(soak.convs)} conversations, {done} replies equal served alone, {lost} answered 409"
    if soak.failures:
        print(f"{len(soak.failures)} failure(s) in {took:.0f}s ({summary}); work dir kept: {ws}")
        return 1
    print(f"ok: {summary} ({took:.0f}s)")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backend", choices=["local", "docker", "both"], default="local")
    ap.add_argument("--work", help="Work directory (default: a new temp dir, removed on success).")
    ap.add_argument("--serve", action="store_true", help="Soak `kvagent serve --session-dir` instead.")
    ap.add_argument("--conversations", type=int, default=4, help="--serve: conversations running at once")
    ap.add_argument("--turns", type=int, default=6, help="--serve: turns of each conversation")
    args = ap.parse_args(argv)
    ws = Path(args.work or tempfile.mkdtemp(prefix="kvagent-soak-")).resolve()
    ws.mkdir(parents=True, exist_ok=True)
    (ws / "logs").mkdir(exist_ok=True)
    if args.serve:
        code = serve_soak(ws, args.seed, args.kills, args.conversations, args.turns)
        if code == 0 and not args.work:
            shutil.rmtree(ws, ignore_errors=True)
        return code
    backends = ["local", "docker"] if args.backend == "both" else [args.backend]
    image = f"kvagent-soak/calc:seed{args.seed}" if "docker" in backends else None
    fixture = make_fixture(ws, image)
    if image:
        build_image(ws, fixture["repo"], image)
    soak = Soak(ws, backends, image, args.seed)
    started = time.monotonic()
    for i in range(args.kills):
        soak.round(i)
    soak.finish()
    took = time.monotonic() - started
    if soak.failures:
        print(f"{len(soak.failures)} failure(s) in {took:.0f}s; work dir kept: {ws}")
        return 1
    print(f"ok: {args.kills} kills, every run recorded once, nothing left behind ({took:.0f}s)")
    if not args.work:
        shutil.rmtree(ws, ignore_errors=True)
    if image:
        subprocess.run(["docker", "rmi", "-f", image], capture_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
