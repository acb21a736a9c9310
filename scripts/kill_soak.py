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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backend", choices=["local", "docker", "both"], default="local")
    ap.add_argument("--work", help="Work directory (default: a new temp dir, removed on success).")
    args = ap.parse_args(argv)
    ws = Path(args.work or tempfile.mkdtemp(prefix="kvagent-soak-")).resolve()
    ws.mkdir(parents=True, exist_ok=True)
    (ws / "logs").mkdir(exist_ok=True)
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
