"""The batch-throughput benchmark's quick mode runs end to end on the tiny model (so it cannot rot)."""

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "batch_throughput.py"


def test_quick_mode_reports_every_n_and_memory(tmp_path):
    spec = importlib.util.spec_from_file_location("batch_throughput", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "batch.json"
    result = bench.main(["--quick", "--ns", "1,2", "--steps", "16", "--json", str(out)])
    assert json.loads(out.read_text())["rows"] == result["rows"]
    rows = result["rows"]
    assert [r["n"] for r in rows] == [1, 2]
    for r in rows:
        assert r["sequential_tok_s"] > 0 and r["concurrent_tok_s"] > 0 and r["hf_tok_s"] > 0
        assert r["rounds_per_session"] >= 1  # eviction ran during the timed decode
    assert rows[1]["mean_batch"] > 1.0  # two sessions really shared forwards
    m = result["memory"]
    # An evicting session's slot is constant; a dense cache at 32k tokens is far larger.
    assert m["evicting_bytes"] < m["dense_bytes@32768"]
    assert m["evicting_fit"] > m["dense_fit@32768"]
