"""Output capture keeps the head and the tail of a long output with bounded memory, so the tool's own
truncation sees what R2E-Gym's sees: `seq 1 100000` through the r2egym execute_bash shows its real
last lines and the `[STDERR]` section (R2E-Gym reads a command's whole output)."""

from __future__ import annotations

import pytest

from kvagent.agent import AgentConfig
from kvagent.agent.scaffold import make_scaffold
from kvagent.sandbox.base import truncation_note
from kvagent.sandbox.procs import CappedReader

from .conftest import BACKENDS, open_backend


def test_reader_keeps_head_and_tail_within_the_cap():
    data = b"".join(b"%07d\n" % i for i in range(200_000))  # 1.6 MB in 64 KiB chunks
    chunks = [data[i : i + 65536] for i in range(0, len(data), 65536)]
    reader = CappedReader(iter(chunks), 1000)
    assert reader.join(10)
    head, tail, dropped = reader.parts()
    assert head == data[:500] and tail == data[-500:]
    assert dropped == len(data) - 1000
    out = reader.output(truncation_note)
    assert out.startswith(data[:500]) and out.endswith(data[-500:])
    assert b"1599000 bytes in the middle not shown" in out


def test_reader_short_output_is_whole():
    reader = CappedReader(iter([b"a" * 300, b"b" * 300]), 1000)
    assert reader.join(10)
    assert reader.output(truncation_note) == b"a" * 300 + b"b" * 300


@pytest.mark.parametrize("backend", BACKENDS)
def test_seq_100000_shows_the_tail_and_stderr_under_r2egym(backend, repo, request):
    scaffold = make_scaffold(AgentConfig(scaffold="r2egym"))
    with open_backend(backend, repo, request) as sb:
        result = sb.run_tool(scaffold.tool("execute_bash"), {"cmd": "seq 1 100000; echo oops >&2"})
    obs = scaffold.observe("execute_bash", result, 90)
    lines = obs.splitlines()
    # R2E-Gym's view of the whole output: its first 40 lines, the marker, its last 40 lines.
    assert lines[:4] == ["Exit code: 0", "Execution output of [execute_bash]:", "[STDOUT]", ""]
    assert lines[4:42] == [str(i) for i in range(1, 39)]
    assert lines[42:45] == ["-" * 50, "<Observation truncated in middle for saving context>", "-" * 50]
    tail = [str(i) for i in range(99965, 100000)] + ["100000 ", "", "[STDERR]", "", "oops"]
    assert lines[45:] == tail
