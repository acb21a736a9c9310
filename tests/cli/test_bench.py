import json

import pytest
from typer.testing import CliRunner

from kvagent.cli.app import app

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _run(*args):
    return CliRunner().invoke(app, list(args))


def test_bench_fidelity_writes_three_files_and_resumes(tmp_path, jsonl_file):
    out = tmp_path / "out"
    args = [
        "bench",
        "fidelity",
        "--model",
        "tiny-random-qwen3",
        "--episodes",
        f"{jsonl_file}:first=1",
        "--policies",
        "random,streaming",
        "--modes",
        "persistent,reprefill",
        "--budgets",
        "96",
        "--max-tokens",
        "400",
        "--protect",
        "sink",
        "--buffer",
        "32",
        "--out",
        str(out),
        "--quiet",
    ]
    r = _run(*args)
    assert r.exit_code == 0, r.output
    for name in ("fidelity.json", "fidelity.md", "fidelity.png"):
        assert (out / name).stat().st_size > 0
    records = json.loads((out / "fidelity.json").read_text())["records"]
    assert len(records) == 5  # full + 2 policies x 2 modes
    assert {r["policy"] for r in records} == {"full", "random", "streaming"}
    assert all(r["rounds"] > 0 for r in records if r["policy"] != "full")
    assert "| random | persistent |" in (out / "fidelity.md").read_text()
    before = (out / "fidelity.json").read_text()
    r = _run(*args)  # everything done already: nothing is rerun
    assert r.exit_code == 0, r.output
    assert json.loads((out / "fidelity.json").read_text())["records"] == json.loads(before)["records"]


def test_reuse_prefix_changes_no_number_but_the_cost(tmp_path, jsonl_file):
    """Reprefill runs with and without --reuse-prefix: every fidelity number the same, fewer tokens run
    (the rest restored), and the table says its wall times are not the protocol's."""
    common = ["bench", "fidelity", "--model", "tiny-random-qwen3", "--episodes", f"{jsonl_file}:first=1",
              "--policies", "snapkv,h2o", "--modes", "reprefill", "--budgets", "96", "--protect", "sink",
              "--buffer", "32", "--max-tokens", "900", "--quiet"]  # fmt: skip
    got = {}
    for flag in ("--reuse-prefix", "--no-reuse-prefix"):
        r = _run(*common, flag, "--out", str(tmp_path / flag))
        assert r.exit_code == 0, r.output
        records = json.loads((tmp_path / flag / "fidelity.json").read_text())["records"]
        got[flag] = {x["policy"]: x for x in records if x["policy"] != "full"}
    on, off = got["--reuse-prefix"], got["--no-reuse-prefix"]
    assert on.keys() == off.keys() == {"snapkv", "h2o"}
    for policy in on:
        a, b = on[policy], off[policy]
        assert a["tokens"] > 512  # a whole prefill chunk, so there is a prefix to reuse
        for field in ("kl", "kl_max", "top1", "logp_true", "probe_logp", "probe_text", "rounds", "evicted"):
            assert a[field] == b[field], field
        assert b["reused_tokens"] == 0 < a["reused_tokens"]
        assert a["prefill_tokens"] + a["reused_tokens"] == b["prefill_tokens"]
    assert "do not time the protocol" in (tmp_path / "--reuse-prefix" / "fidelity.md").read_text()
    assert "do not time the protocol" not in (tmp_path / "--no-reuse-prefix" / "fidelity.md").read_text()


@pytest.mark.parametrize(
    "bad, field",
    [
        (["--policies", "bogus"], "policies"),
        (["--budgets", "abc"], "budgets"),
        (["--budgets", "0"], "budgets"),
        (["--modes", "sometimes"], "modes"),
        (["--protect", "all"], "protect"),
        (["--policies", "nexus", "--budgets", "100"], "budget"),
        (["--episodes", "missing.jsonl"], "episodes"),
        (["--policies", "pyramidkv", "--budgets", "96", "--cadence", "phase"], "cadence"),
    ],
)
def test_bad_values_give_one_line_and_exit_2(tmp_path, bad, field):
    r = _run("bench", "fidelity", "--model", "tiny-random-qwen3", "--out", str(tmp_path), "--quiet", *bad)
    assert r.exit_code == 2
    lines = [x for x in r.output.strip().splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("kvagent: error:") and field in lines[0], r.output


def test_an_episode_past_the_models_context_is_refused_before_any_replay(tmp_path, jsonl_file, monkeypatch):
    import kvagent.cli.bench.run as bench
    from kvagent.cli.common import load_engine

    def short_context(*args, **kwargs):
        engine = load_engine(*args, **kwargs)
        engine.max_context = 300
        return engine

    monkeypatch.setattr(bench, "load_engine", short_context)
    common = ["bench", "fidelity", "--model", "tiny-random-qwen3", "--episodes", f"{jsonl_file}:first=1",
              "--policies", "random", "--budgets", "96", "--protect", "sink", "--buffer", "32", "--quiet"]  # fmt: skip
    r = _run(*common, "--out", str(tmp_path / "a"))
    assert r.exit_code == 2
    lines = [x for x in r.output.strip().splitlines() if x.strip()]
    assert len(lines) == 1 and "past tiny-random-qwen3's context of 300" in lines[0], r.output
    assert lines[0].endswith("--max-tokens 300") and not (tmp_path / "a" / "fidelity.json").exists()
    r = _run(*common, "--max-tokens", "300", "--out", str(tmp_path / "b"))  # the advice works
    assert r.exit_code == 0, r.output


@pytest.mark.slow
def test_bench_speed_smoke(tmp_path):
    out = tmp_path / "speed"
    r = _run(
        "bench",
        "speed",
        "--model",
        "tiny-random-qwen3",
        "--policies",
        "full,random",
        "--lengths",
        "48,96",
        "--budget",
        "32",
        "--buffer",
        "16",
        "--steps",
        "16",
        "--episode",
        "gen:turns=10,prompt=compact",
        "--device",
        "cpu",
        "--out",
        str(out),
        "--quiet",
    )
    assert r.exit_code == 0, r.output
    data = json.loads((out / "speed.json").read_text())
    rows = {(d["policy"], d["length"]): d for d in data["decode"]}
    assert rows[("random", 96)]["rounds"] > 0 and rows[("random", 96)]["entries"] <= 32 + 16
    assert rows[("full", 96)]["entries"] == 96 + 16  # full keeps everything fed
    modes = {e["mode"]: e for e in data["episode"]}
    assert modes["reprefill"]["prefill_tokens"] > 2 * modes["persistent"]["prefill_tokens"]
    assert (out / "speed.png").stat().st_size > 0 and (out / "speed.md").exists()
