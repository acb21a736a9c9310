"""Report statistics against hand-computed values on a small table."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from kvagent.errors import KvagentError
from kvagent.evals.report import render_markdown, write_report
from kvagent.evals.stats import build_table, load_runs, percentile_ci, sign_test, summarize


def run(iid, policy, seed, resolved, mode="persistent", budget=1024, **over):
    rec = {
        "instance_id": iid,
        "policy": policy,
        "mode": mode,
        "budget": budget,
        "seed": seed,
        "resolved": resolved,
        "exit_status": "submitted" if resolved else "max_steps",
        "steps": 10,
        "tokens": 1000,
        "evictions": 0,
        "kv_bytes": 2**20,
        "framework": "recent-buffer",  # what today's runner records (a record without it is pre-#26)
    }
    rec.update(over)
    if rec["framework"] is None:  # a record from before the field existed
        del rec["framework"]
    return rec


# Per instance, resolved for seeds (0, 1):
#   A: i1 (1,1)  i2 (1,0)  i3 (0,0)  i4 (1,1)  -> instance means 1, .5, 0, 1 -> Pass@1 = 2.5/4 = .625
#   B: i1 (1,0)  i2 (0,0)  i3 (0,0)  i4 (1,1)  -> instance means .5, 0, 0, 1 -> Pass@1 = 1.5/4 = .375
TABLE = {
    "A": {"i1": (1, 1), "i2": (1, 0), "i3": (0, 0), "i4": (1, 1)},
    "B": {"i1": (1, 0), "i2": (0, 0), "i3": (0, 0), "i4": (1, 1)},
}


def small_runs():
    runs = []
    for policy, per in TABLE.items():
        for iid, outcomes in per.items():
            for seed, res in enumerate(outcomes):
                # A's costs: steps 10/20 by seed; B's: 30. tokens differ per instance.
                steps = (10 + 10 * seed) if policy == "A" else 30
                runs.append(
                    run(
                        iid,
                        policy,
                        seed,
                        bool(res),
                        steps=steps,
                        tokens=int(iid[1]) * 100,
                        evictions=seed,
                        kv_bytes=2**21,
                    )
                )
    return runs


def config(summary, policy, mode="persistent", budget=1024):
    (row,) = [
        r for r in summary["configs"] if (r["policy"], r["mode"], r["budget"]) == (policy, mode, budget)
    ]
    return row


def test_pass_at_1_resolved_and_means_by_hand():
    s = summarize(small_runs(), n_boot=500, seed=1)
    a, b = config(s, "A"), config(s, "B")
    assert a["pass_at_1"] == pytest.approx(0.625)
    assert b["pass_at_1"] == pytest.approx(0.375)
    assert a["resolved_runs"] == 5 and b["resolved_runs"] == 3
    assert a["resolved"] == pytest.approx(2.5) and b["resolved"] == pytest.approx(1.5)  # per seed
    assert a["pass_at_k"] == pytest.approx(0.75) and b["pass_at_k"] == pytest.approx(0.5)
    assert a["n_instances"] == 4 and a["n_runs"] == 8 and a["seeds"] == [0, 1]
    assert a["mean_steps"] == pytest.approx(15.0) and b["mean_steps"] == pytest.approx(30.0)
    assert a["mean_tokens"] == pytest.approx(250.0)  # (100+200+300+400)/4
    assert a["mean_evictions"] == pytest.approx(0.5)
    assert a["mean_kv_bytes"] == pytest.approx(2**21)
    assert a["exit_status"] == {"submitted": 5, "max_steps": 3}


def test_comparison_sign_test_and_paired_ci():
    s = summarize(small_runs(), n_boot=2000, seed=3)
    (c,) = s["comparisons"]
    assert (c["a"], c["b"]) == ("A", "B")
    assert c["diff"] == pytest.approx(0.25)
    # A better on i1 and i2, ties on i3 and i4: p = 2 * C(2,0) / 2^2 = 0.5
    assert (c["a_better"], c["b_better"], c["ties"], c["n_paired"]) == (2, 0, 2, 4)
    assert c["sign_test_p"] == pytest.approx(0.5)
    lo, hi = c["diff_ci"]
    # Paired: A >= B on every instance, so no replicate can show A behind B. An unpaired
    # bootstrap would put mass below zero.
    assert 0.0 <= lo <= 0.25 <= hi <= 0.5


@pytest.mark.parametrize(
    ("wins", "losses", "p"),
    [
        (0, 0, 1.0),
        (2, 0, 0.5),  # 2 * 1/4
        (0, 5, 0.0625),  # 2 * 1/32
        (1, 6, 0.125),  # 2 * (1 + 7)/128
        (9, 1, 0.021484375),  # 2 * (1 + 10)/1024
        (2, 3, 1.0),  # 2 * (1 + 5 + 10)/32 = 1
        (5, 5, 1.0),  # capped at 1
        (12, 0, 2 / 4096),
    ],
)
def test_sign_test_by_hand(wins, losses, p):
    assert sign_test(wins, losses) == pytest.approx(p, rel=1e-12)
    assert sign_test(losses, wins) == pytest.approx(p, rel=1e-12)  # two-sided: symmetric


def test_sign_test_large_n_stays_exact():
    # 0 vs 1100: 2 / 2^1100 underflows a float to 0.0, but never goes negative or NaN.
    assert 0.0 <= sign_test(0, 1100) < 1e-300
    assert sign_test(500, 520) == pytest.approx(sum(math.comb(1020, k) for k in range(501)) * 2 / 2**1020)


def test_bootstrap_ci_contains_estimate_and_is_deterministic():
    runs = small_runs()
    s1 = summarize(runs, n_boot=1000, seed=7)
    s2 = summarize(runs, n_boot=1000, seed=7)
    assert s1 == s2
    # With 40 instances the percentiles are fine-grained enough that another seed moves them.
    rng = np.random.default_rng(0)
    many = [run(f"i{j}", p, k, bool(rng.random() < 0.4)) for j in range(40) for p in "AB" for k in range(3)]
    ci = lambda seed: [r["pass_at_1_ci"] for r in summarize(many, n_boot=400, seed=seed)["configs"]]  # noqa: E731
    assert ci(7) == ci(7) and ci(7) != ci(8)
    for row in s1["configs"]:
        lo, hi = row["pass_at_1_ci"]
        assert 0.0 <= lo <= row["pass_at_1"] <= hi <= 1.0
        assert hi > lo  # the instances disagree, so the interval has width


def test_ci_of_constant_is_that_constant():
    runs = [run(f"i{j}", "full", seed, True, budget=None) for j in range(5) for seed in range(3)]
    runs += [run(f"i{j}", "snap", seed, False, budget=None) for j in range(5) for seed in range(3)]
    s = summarize(runs, n_boot=300, seed=0)
    assert config(s, "full", budget=None)["pass_at_1_ci"] == [1.0, 1.0]
    assert config(s, "snap", budget=None)["pass_at_1_ci"] == [0.0, 0.0]
    (c,) = s["comparisons"]  # both unbudgeted: compared as peers, not as references
    assert c["diff"] == 1.0 and c["diff_ci"] == [1.0, 1.0]
    assert c["sign_test_p"] == pytest.approx(2 / 2**5)


def test_identical_policies_have_zero_difference():
    runs = small_runs() + [dict(r, policy="A2") for r in small_runs() if r["policy"] == "A"]
    s = summarize(runs, n_boot=300, seed=0)
    (c,) = [c for c in s["comparisons"] if {c["a"], c["b"]} == {"A", "A2"}]
    assert c["diff"] == 0.0 and c["diff_ci"] == [0.0, 0.0] and c["sign_test_p"] == 1.0
    assert len(s["comparisons"]) == 3  # every pair within a mode x budget


def test_budgeted_configs_compare_against_unbudgeted_reference():
    runs = small_runs() + [run(f"i{j}", "full", 0, True, budget=None) for j in range(1, 5)]
    s = summarize(runs, n_boot=200, seed=0)
    refs = {(c["a"], c["b"]): c for c in s["comparisons"] if c["b_budget"] is None}
    assert set(refs) == {("A", "full"), ("B", "full")}
    a = refs[("A", "full")]
    # full resolves all four; A: 1, .5, 0, 1 -> diff -.375, full better on i2 and i3: p = 2 * 1/4
    assert a["diff"] == pytest.approx(-0.375) and (a["a_better"], a["b_better"]) == (0, 2)
    assert a["sign_test_p"] == pytest.approx(0.5) and a["diff_ci"][1] <= 0.0


def test_groups_by_mode_and_budget_and_rerun_replaces():
    runs = small_runs()
    runs += [run("i1", "A", 0, False, mode="reprefill"), run("i1", "A", 0, True, mode="reprefill")]
    runs += [run("i1", "A", 0, True, budget=2048.0)]
    t = build_table(runs)
    labels = [c.label for c in t.configs]  # the run spec's label, as in file names
    assert labels == [
        "A__persistent__K1024__recent-buffer",
        "A__persistent__K2048__recent-buffer",
        "B__persistent__K1024__recent-buffer",
        "A__reprefill__K1024__recent-buffer",
    ]
    s = summarize(runs, n_boot=100)
    assert config(s, "A", mode="reprefill")["pass_at_1"] == 1.0  # the later record of (i1, seed 0) wins
    assert config(s, "A", budget=2048)["n_instances"] == 1


def test_percentile_ci_ignores_nan():
    assert percentile_ci(np.array([np.nan, 0.5, 0.5])) == (0.5, 0.5)
    lo, hi = percentile_ci(np.array([np.nan, np.nan]))
    assert math.isnan(lo) and math.isnan(hi)


def test_write_report_outputs(tmp_path):
    runs = small_runs()
    runs += [run(f"i{j}", "full", 0, j % 2 == 0, budget=None) for j in range(1, 5)]
    runs += [dict(r, mode="reprefill", budget=r["budget"]) for r in small_runs()]
    (tmp_path / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))
    summary = write_report(tmp_path)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["report.json", "report.md", "report.png", "runs.jsonl"]  # no temp files left
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["configs"][0].keys() == summary["configs"][0].keys()
    assert config(data, "A")["pass_at_1"] == pytest.approx(0.625)
    md = (tmp_path / "report.md").read_text()
    assert "| A | persistent | 1024 | 4 | 2 | 2.50 | 62.5 |" in md
    assert "| persistent | 1024 | A | B | 4 | 25.0 |" in md
    assert "| persistent | 1024 | A | full (-) | 4 |" in md
    assert "| full | persistent | - |" in md
    png = (tmp_path / "report.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_load_runs_errors(tmp_path):
    with pytest.raises(KvagentError, match="no runs file"):
        write_report(tmp_path)
    path = tmp_path / "runs.jsonl"
    rec = run("i1", "A", 0, True)
    del rec["seed"]
    path.write_text(json.dumps(run("i1", "A", 1, True)) + "\n" + json.dumps(rec) + "\n")
    with pytest.raises(KvagentError, match=r"runs.jsonl:2: run record lacks field 'seed'"):
        load_runs(path)
    path.write_text("")
    with pytest.raises(KvagentError, match="no finished runs"):
        write_report(tmp_path)


def test_head_budget_scope_and_protect_variants_are_their_own_configurations(tmp_path):
    """Runs that differ only in head budget (or scope / protect) must not be pooled into one row."""
    runs = [run(f"i{k}", "snapkv", 0, True) for k in range(3)]
    runs += [run(f"i{k}", "snapkv", 0, k == 0, head_budget="adaptive") for k in range(3)]
    runs += [run("i0", "snapkv", 0, False, protect="sink")]
    s = summarize(runs, n_boot=50)
    rows = {(r["policy"], r["variant"]): r for r in s["configs"]}
    assert rows[("snapkv", "")]["pass_at_1"] == 1.0
    assert rows[("snapkv", "heads-adaptive")]["pass_at_1"] == pytest.approx(1 / 3)
    assert rows[("snapkv", "protect-sink")]["n_instances"] == 1
    write_report_runs = tmp_path / "runs.jsonl"
    write_report_runs.write_text("".join(json.dumps(r) + "\n" for r in runs))
    write_report(tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert "| snapkv (heads-adaptive) | persistent |" in md and "| snapkv | persistent |" in md


def test_a_sweep_carries_the_head_budget_into_labels_and_configs():
    from kvagent.errors import ConfigError
    from kvagent.runspec import sweep

    specs = sweep(["full", "snapkv"], ["persistent"], [64], head_budget="adaptive")
    by_policy = {s.policy: s for s in specs}
    assert by_policy["snapkv"].label == "snapkv__persistent__K64__heads-adaptive__recent-buffer"
    assert by_policy["snapkv"].cache_config().head_budget == "adaptive"
    assert by_policy["full"].label == "full__persistent__dense"  # one dense run serves both
    with pytest.raises(ConfigError, match="head_budget"):
        sweep(["random"], ["persistent"], [64], head_budget="adaptive")


def test_tables_name_the_framework_only_where_it_is_not_the_default():
    # Today's default (recent-buffer) reads as the plain policy; a record from before the field
    # existed ran topk-all and says so; both are their own configurations with a framework field.
    runs = [run(i, "random", 0, True) for i in ("i1", "i2")]
    runs += [run(i, "random", 0, False, framework=None) for i in ("i1", "i2")]
    s = summarize(runs, n_boot=200, seed=0)
    rows = {(r["policy"], r["variant"]): r for r in s["configs"]}
    assert set(rows) == {("random", ""), ("random", "topk-all")}
    assert rows[("random", "")]["framework"] == "recent-buffer" and rows[("random", "")]["pass_at_1"] == 1.0
    assert rows[("random", "topk-all")]["framework"] == "topk-all"
    (c,) = s["comparisons"]
    assert {c["a"], c["b"]} == {"random", "random (topk-all)"}
    md = render_markdown(s)
    assert (
        "| random (topk-all) |" in md
        and "| random |" in md
        and "recent-buffer" not in md.split("| policy |")[1]
    )
