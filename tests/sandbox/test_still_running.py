"""One check of "is this process still the one we started" (pid + start time), asked by sandbox
owners, Ray actors' run dirs and bench claims alike: a live pid whose start time differs is a new
process that took a dead one's pid."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from kvagent.bench.fidelity.shared_results import SharedResults
from kvagent.evals.distributed import RUN_TMP_PREFIX, sweep_stale_run_dirs
from kvagent.sandbox.owner import Owner, process_start, still_running

ME = os.getpid()
START = process_start(ME)


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_process_is_the_one_started_only_with_its_own_start_time():
    assert START
    assert still_running(ME, START) and still_running(ME) and still_running(ME, "0")
    assert not still_running(ME, str(int(START) + 1))  # the pid was taken by a newer process
    assert not still_running(_dead_pid(), "0")
    assert Owner.me().alive() and not Owner(ME, str(int(START) + 1), Owner.me().host).alive()


def test_a_claim_of_a_reused_pid_is_free_and_a_live_ones_is_not(tmp_path):
    a, b = (SharedResults(tmp_path / "fidelity.json", lambda r: r["k"]) for _ in range(2))
    assert a.owner["start"] == START
    assert a.claim("x") and not b.claim("x")  # held by a live owner
    claim = a._claim_file("x")
    claim.write_text(json.dumps({**a.owner, "start": str(int(START) + 1), "token": "old"}))
    assert b.claim("x")  # its pid is ours now, its start time is not: that owner is gone


def test_a_run_dir_of_a_reused_pid_is_swept_and_a_live_actors_kept():
    base = Path(tempfile.mkdtemp())
    try:
        mine = base / f"{RUN_TMP_PREFIX}{ME}-{START}-abcd1234"
        reused = base / f"{RUN_TMP_PREFIX}{ME}-{int(START) + 1}-abcd1234"
        older = base / f"{RUN_TMP_PREFIX}{ME}-abcd1234"  # named before start times: the pid decides
        dead = base / f"{RUN_TMP_PREFIX}{_dead_pid()}-1-abcd1234"
        for d in (mine, reused, older, dead):
            d.mkdir()
        assert sorted(sweep_stale_run_dirs(base)) == sorted([reused, dead])
        assert mine.is_dir() and older.is_dir()
    finally:
        shutil.rmtree(base)
