"""`bench fidelity --head-budget uniform,adaptive`: Ada-KV runs beside uniform ones, keyed and shown
apart, for the policies that support them."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvagent.bench.fidelity.run import make_grid, record_key
from kvagent.bench.fidelity.tables import fidelity_markdown, fidelity_rows
from kvagent.cli.app import app
from kvagent.errors import ConfigError


def test_the_grid_adds_adaptive_runs_only_where_a_policy_supports_them():
    grid = make_grid(["random", "snapkv", "tova"], ["persistent"], ["prefill+decode"], [256], ["sink"],
                     axes={"head_budget": ("uniform", "adaptive")}, policy_args={"tova": {"shared": False}})  # fmt: skip
    got = {(s.policy, s.head_budget) for s in grid}
    assert got == {
        ("full", "uniform"),
        ("random", "uniform"),
        ("snapkv", "uniform"),
        ("tova", "uniform"),
        ("snapkv", "adaptive"),
        ("tova", "adaptive"),
    }
    # tova shares one keep-set per layer by default: no adaptive run without shared=false, and a
    # value no policy takes fails with the policy's own reason.
    with pytest.raises(ConfigError, match="^head_budget: adaptive needs one keep-set per head, but tova"):
        make_grid(
            ["tova"], ["persistent"], ["prefill+decode"], [256], ["sink"], axes={"head_budget": ("adaptive",)}
        )


def test_records_of_the_two_head_budgets_never_share_a_key():
    rec = {"episode": "e", "policy": "snapkv", "mode": "persistent", "budget": 256}
    assert record_key(rec) == record_key({**rec, "head_budget": "uniform"})  # files from before
    assert record_key(rec) != record_key({**rec, "head_budget": "adaptive"})


def test_tables_show_adaptive_runs_on_their_own_line():
    base = {"status": "ok", "mode": "persistent", "scope": "prefill+decode", "protect": "sink", "budget": 256,
            "kl": 0.5, "top1": 0.8, "logp_true": -2.0}  # fmt: skip
    recs = [
        {**base, "policy": "snapkv"},
        {**base, "policy": "snapkv", "head_budget": "adaptive", "kl": 0.25},
    ]
    rows = {r["policy"]: r for r in fidelity_rows(recs)}
    assert rows["snapkv"]["kl"] == 0.5 and rows["snapkv+adaptive"]["kl"] == 0.25
    assert "| snapkv+adaptive | persistent |" in fidelity_markdown(recs)


def test_the_command_runs_both_and_says_which_policies_stay_uniform(tmp_path, jsonl_file):
    out = tmp_path / "out"
    args = ["bench", "fidelity", "--model", "tiny-random-qwen3", "--episodes", f"{jsonl_file}:first=1",
            "--policies", "random,snapkv", "--modes", "persistent", "--budgets", "96", "--max-tokens", "400",
            "--protect", "sink", "--buffer", "32", "--head-budget", "uniform,adaptive", "--out", str(out),
            "--quiet"]  # fmt: skip
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "not for random" in r.output
    records = json.loads((out / "fidelity.json").read_text())["records"]
    assert sorted((x["policy"], x["head_budget"]) for x in records) == [
        ("full", "uniform"), ("random", "uniform"), ("snapkv", "adaptive"), ("snapkv", "uniform")
    ]  # fmt: skip
    assert all(x["rounds"] > 0 for x in records if x["policy"] != "full")
    assert "| snapkv+adaptive |" in (out / "fidelity.md").read_text()
    bad = CliRunner().invoke(app, [*args[:-3], "--head-budget", "adaptive", "--policies", "random", "--out",
                                   str(tmp_path / "o2"), "--quiet"])  # fmt: skip
    assert bad.exit_code == 2 and "head-budget" in bad.output


def test_records_of_other_frameworks_or_schedules_never_share_a_key():
    rec = {"episode": "e", "policy": "pyramidkv", "mode": "persistent", "budget": 256}
    # A record from before issue #26 ran topk-all and the uniform split (pyramidkv's own then).
    assert record_key(rec) == record_key({**rec, "framework": "topk-all", "schedule": "uniform"})
    assert record_key(rec) != record_key({**rec, "framework": "recent-buffer", "schedule": "uniform"})
    assert record_key(rec) != record_key({**rec, "framework": "topk-all", "schedule": "paper"})


def test_each_record_names_the_schedule_its_policy_ran(tiny_engine, episode_record):
    # Issue #32: a pyramidkv record must say it ran the paper's split, so a record from the old
    # split (no field: "uniform") can never be resumed as today's run.
    from kvagent.bench import replay as rp
    from kvagent.bench.episodes import from_messages
    from kvagent.bench.fidelity.run import summarise
    from kvagent.bench.stream import build_stream
    from kvagent.runspec import RunSpec

    stream = build_stream(from_messages("fx", episode_record(turns=3)["messages"]), tiny_engine.tokenizer)
    ref = rp.reference_run(tiny_engine, stream)
    got = {}
    for policy in ("pyramidkv", "snapkv"):
        spec = RunSpec(policy=policy, budget=48, buffer=8, protect="sink")
        res = rp.policy_run(tiny_engine, stream, spec, ref.reference)
        got[policy] = summarise(spec, stream, "tiny", res, 0.0)["schedule"]
    assert got == {"pyramidkv": "paper", "snapkv": "uniform"}
