"""A small bounded run of scripts/kill_soak.py's server soak (issue 57.3): two conversations at a
time against `kvagent serve --session-dir`, the server killed three times at seeded points (seed
1: first a SIGTERM whose saved sessions then get a byte flipped; the later kills and damage
seeded too, SIGKILL among them in our runs) and restarted on the same dir, a last SIGTERM: every
reply equal to the conversation served alone, a conversation whose session's file was damaged
never continued, every lost one answered 409 with its one cause, no file half-written. The
soak's own checks are the assertions (each fails when the checksum or the history proof is
taken out); this runs it: real processes on 127.0.0.1, the tiny random model, about 2 minutes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "kill_soak.py"


@pytest.mark.slow
def test_the_server_soak_continues_exactly_or_says_lost(tmp_path):
    argv = [sys.executable, str(SCRIPT), "--serve", "--kills", "3", "--conversations", "2", "--turns", "3",
            "--seed", "1", "--work", str(tmp_path)]  # fmt: skip
    r = subprocess.run(argv, capture_output=True, text=True, timeout=850)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "server 0: SIGTERM" in out and "(flip)" in out, out  # the seeded faults did happen
    assert "ok: 3 kills" in out and "FAIL" not in out, out
