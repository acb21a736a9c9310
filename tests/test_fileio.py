"""The one JSONL writer heals a torn tail before appending; the one reader skips a torn last line."""

import json
import threading

import pytest

from kvagent.errors import KvagentError
from kvagent.fileio import append_jsonl, read_jsonl


def records(path):
    return [rec for _, rec in read_jsonl(path)]


def test_append_after_a_torn_last_line_keeps_every_whole_record(tmp_path):
    path = tmp_path / "runs.jsonl"
    append_jsonl(path, {"run_id": "a"})
    append_jsonl(path, {"run_id": "b"})
    with path.open("ab") as f:  # power loss in the middle of the third record
        f.write(b'{"run_id": "c", "model_pat')
    assert records(path) == [{"run_id": "a"}, {"run_id": "b"}]  # the reader skips the fragment

    append_jsonl(path, {"run_id": "d"})
    append_jsonl(path, {"run_id": "e"})
    assert records(path) == [{"run_id": "a"}, {"run_id": "b"}, {"run_id": "d"}, {"run_id": "e"}]
    assert path.read_text().endswith('{"run_id": "e"}\n')


def test_a_whole_last_record_without_its_newline_is_kept(tmp_path):
    path = tmp_path / "runs.jsonl"
    path.write_text('{"run_id": "a"}\n{"run_id": "b"}')
    append_jsonl(path, {"run_id": "c"})
    assert [r["run_id"] for r in records(path)] == ["a", "b", "c"]


def test_a_file_that_is_only_a_fragment_is_healed(tmp_path):
    path = tmp_path / "runs.jsonl"
    path.write_bytes('{"run_id": "caf\u00e9'.encode()[:-1])  # torn inside a multi-byte character
    assert records(path) == []
    append_jsonl(path, {"run_id": "x"})
    assert records(path) == [{"run_id": "x"}]


def test_a_bad_line_in_the_middle_is_a_one_line_error(tmp_path):
    path = tmp_path / "runs.jsonl"
    path.write_text('{"a": 1}\n{"a": \n{"a": 2}\n')
    with pytest.raises(KvagentError, match=r"runs.jsonl:2: invalid JSON"):
        records(path)


def test_concurrent_appends_write_whole_lines(tmp_path):
    path = tmp_path / "runs.jsonl"
    big = "x" * 100_000  # larger than a pipe buffer: one write must still land whole

    def write(n):
        for i in range(20):
            append_jsonl(path, {"w": n, "i": i, "pad": big})

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = path.read_text().splitlines()
    assert len(lines) == 80 and all(json.loads(x)["pad"] == big for x in lines)


def test_atomic_writes_get_the_modes_open_would_give(tmp_path):
    """Reports and trajectories are for sharing: not mkstemp's private 0o600, but 0o666 less the umask."""
    import os

    from kvagent.fileio import atomic_write_bytes, atomic_write_text

    old = os.umask(0o022)
    try:
        assert (atomic_write_text(tmp_path / "a.md", "x").stat().st_mode & 0o777) == 0o644
    finally:
        os.umask(old)
    assert (atomic_write_bytes(tmp_path / "k", b"x", mode=0o600).stat().st_mode & 0o777) == 0o600
