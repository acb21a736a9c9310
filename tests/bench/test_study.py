import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from kvagent.bench import replay as rp
from kvagent.bench.episodes import from_messages
from kvagent.bench.stream import build_stream
from kvagent.bench.study import (
    StudyPlan,
    budget_for,
    clip_messages,
    position_buckets,
    scored_positions,
    specs_for,
)
from kvagent.bench.study_report import SECTIONS
from kvagent.bench.study_stats import mean_ci, paired, trend
from kvagent.errors import ConfigError
from kvagent.runtime.budget import common_block


# ----------------------------------------------------------------------- statistics
def test_mean_ci_brackets_the_mean_and_narrows_with_more_episodes():
    rng = np.random.default_rng(1)
    small = mean_ci(rng.normal(1.0, 0.5, 5))
    large = mean_ci(rng.normal(1.0, 0.5, 200))
    for c in (small, large):
        assert c.lo <= c.mean <= c.hi
    assert large.hi - large.lo < small.hi - small.lo
    assert math.isnan(mean_ci([2.0]).lo) and mean_ci([2.0]).mean == 2.0
    assert mean_ci([3.0, 3.0, 3.0]).lo == 3.0 == mean_ci([3.0, 3.0, 3.0]).hi


def test_paired_sees_a_consistent_shift_that_unpaired_noise_hides():
    rng = np.random.default_rng(0)
    base = rng.normal(0, 5, 12)  # large between-episode spread
    p = paired(base + 0.3, base)
    assert p.excludes_zero() and p.diff.lo > 0
    assert p.above == 12 and p.below == 0
    assert 0 <= p.p_wilcoxon < 0.01 and 0 <= p.p_sign < 0.01
    same = paired(base, base)
    assert same.p_wilcoxon == 1.0 and same.p_sign == 1.0 and same.ties == 12 and not same.excludes_zero()
    with pytest.raises(ValueError):
        paired([1.0], [1.0, 2.0])


def test_trend_finds_a_slope_and_none_in_flat_data():
    x = np.arange(20.0)
    t = trend(x, 2 * x + np.random.default_rng(0).normal(0, 0.1, 20))
    assert t.slope == pytest.approx(2, abs=0.05) and t.p_slope < 1e-6 and t.rho > 0.9
    flat = trend(x, np.ones(20))
    assert flat.p_slope == 1.0 and math.isnan(flat.slope)


# ----------------------------------------------------------------------- plan
def test_fraction_budgets_become_a_block_multiple_per_episode():
    block = common_block()
    assert budget_for(0.2, 10_000) % block == 0
    assert abs(budget_for(0.2, 10_000) - 2000) <= block / 2
    assert budget_for(0.01, 100) == block  # never below one block


def test_plan_rejects_token_budgets_and_unknown_ablation_policies():
    with pytest.raises(ConfigError, match="fractions"):
        StudyPlan(policies=("random",), fractions=(512,))
    with pytest.raises(ConfigError, match="ablation-policies"):
        StudyPlan(policies=("random",), ablation_policies=("snapkv",))


def test_specs_per_episode_seed_only_random_draw_policies(tiny_engine, episode_record):
    stream = build_stream(from_messages("e", episode_record(turns=6)["messages"]), tiny_engine.tokenizer)
    plan = StudyPlan(policies=("random", "snapkv"), modes=("persistent",), fractions=(0.2, 0.4), seeds=(0, 1),
                     ablation_fraction=0.4, ablation_protects=("none", "sink"))  # fmt: skip
    specs = specs_for(plan, stream)
    ks = {budget_for(f, len(stream.ids)) for f in (0.2, 0.4)}
    assert {s.budget for s in specs if s.policy != "full"} == ks
    assert {s.seed for s in specs if s.policy == "random"} == {0, 1}
    assert {s.seed for s in specs if s.policy == "snapkv"} == {0}
    assert {s.protect for s in specs if s.policy != "full"} == {"none", "sink"}
    assert len(specs) == len(set(specs))


def test_position_buckets_follow_the_scored_tokens(tiny_engine, episode_record):
    stream = build_stream(from_messages("e", episode_record(turns=6)["messages"]), tiny_engine.tokenizer)
    pos = scored_positions(stream)
    assert len(pos) == stream.n_scored and pos == sorted(pos)
    ids = stream.ids
    targets = rp.scored_targets(stream)
    assert [ids[p] for p in pos] == targets
    res = rp.ReplayResult(kl=[float(p) for p in pos], agree=[True] * len(pos), logp_true=[0.0] * len(pos))
    b = position_buckets(stream, res, 128)
    assert sum(row[1] for row in b) == len(pos)
    for start, n, kl, top1, _ in b:
        inside = [p for p in pos if start <= p < start + 128]
        assert n == len(inside) and kl == pytest.approx(sum(inside) / n) and top1 == 1.0


def test_clip_keeps_head_and_tail_so_the_planted_fact_survives(episode_record):
    long = episode_record(turns=3)
    long["messages"][3]["content"] = "x" * 5000  # the first observation, where the fact is planted
    ep = from_messages("e", long["messages"])
    clipped = clip_messages(ep, 400)
    assert all(len(m["content"]) <= 400 + 40 for m in clipped.messages)
    obs = clipped.messages[3]["content"]
    assert "characters cut" in obs and "7319-AXQ" in obs
    assert clipped.probe == ep.probe and ep.messages[3]["content"].startswith("x" * 5000)


def _records(n_eps: int, kl: dict[str, float], growth: dict[str, float] | None = None) -> list[dict]:
    """Synthetic study records: persistent, protect=sink, budget 0.2 of 1000-token episodes; each
    policy's KL is kl[policy] plus episode noise, its position buckets grow by growth[policy]."""
    rng = np.random.default_rng(0)
    out = []
    for e in range(n_eps):
        noise = rng.normal(0, 0.01)
        base = {"status": "ok", "episode": f"ep{e}", "tokens": 1000, "prompt_tokens": 100, "turns": 3,
                "n_scored": 90, "top1": 0.5, "logp_true": -1.0, "probe_retrieved": None, "mode": "persistent",
                "protect": "sink"}  # fmt: skip
        out.append({**base, "policy": "full", "budget": None, "seed": 0, "kl": 0.0, "positions": []})
        for pol, v in kl.items():
            for seed in (0, 1) if pol in ("random", "nexus") else (0,):
                g = (growth or {}).get(pol, 0.0)
                pos = [[b, 30, v + noise + g * b / 256, 0.5, -1.0] for b in (0, 256, 512)]
                out.append({**base, "policy": pol, "budget": budget_for(0.2, 1000), "seed": seed,
                            "kl": v + noise, "positions": pos})  # fmt: skip
    return out


@pytest.mark.parametrize("n_eps", [3, 8])
def test_verdicts_follow_the_rules_and_need_enough_episodes(n_eps):
    from kvagent.bench.study_analysis import analyse

    plan = StudyPlan(policies=("random", "nexus", "snapkv", "h2o"), modes=("persistent",), fractions=(0.2,),
                     seeds=(0, 1), ablation_fraction=0.2, ablation_protects=("sink",))  # fmt: skip
    # random far behind the best deterministic (h2o); nexus ahead of it, more so later in the episode.
    recs = _records(n_eps, {"random": 0.9, "nexus": 0.2, "snapkv": 0.5, "h2o": 0.4},
                    growth={"nexus": -0.1})  # fmt: skip
    a = analyse(recs, plan)
    (c,) = a["random_attention"]["comparisons"]
    assert c["best"] == "h2o" and c["mean"] == pytest.approx(0.5) and c["lo"] <= c["mean"] <= c["hi"]
    expected = "inconclusive" if n_eps < 6 else "contradicted"
    assert a["random_attention"]["verdict"] == expected
    assert a["nexus"]["verdict"] == ("inconclusive" if n_eps < 6 else "supported")
    assert a["nexus"]["by_position"]["trend"]["slope"] > 0
    # Random within a hair of the best: "about as good".
    close = analyse(_records(n_eps, {"random": 0.401, "h2o": 0.4}), plan)
    assert close["random_attention"]["verdict"] == ("inconclusive" if n_eps < 6 else "supported")


# ----------------------------------------------------------------------- the smoke study (CLI)
@pytest.fixture
def two_episodes(tmp_path, episode_record):
    path = tmp_path / "two.jsonl"
    path.write_text("".join(json.dumps(episode_record(f"fixture-{k}", turns=3)) + "\n" for k in (1, 2)))
    return path


def test_smoke_study_writes_every_section_with_statistics(tmp_path, two_episodes):
    from kvagent.cli.app import app

    out = tmp_path / "study"
    args = [
        "bench", "study", "--model", "tiny-random-qwen3", "--device", "cpu", "--episodes", str(two_episodes),
        "--policies", "random,snapkv", "--modes", "persistent,reprefill", "--budgets", "0.2,0.4",
        "--seeds", "0,1", "--ablation-budget", "0.4", "--ablation-protect", "none,sink",
        "--bucket", "128", "--workers", "2", "--out", str(out), "--quiet",
    ]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "estimated" in res.output
    md = (out / "study.md").read_text()
    for section in SECTIONS:
        assert section in md
    for png in ("study_kl.png", "study_claims.png", "study_position.png"):
        assert (out / png).stat().st_size > 1000
    a = json.loads((out / "study.json").read_text())
    assert {e["episode"] for e in a["episodes"]} == {"fixture-1", "fixture-2"}
    main = [s for s in a["settings"] if s["protect"] == "sink"]
    assert {(s["policy"], s["mode"], s["fraction"]) for s in main} == {
        (p, m, f) for p in ("random", "snapkv") for m in ("persistent", "reprefill") for f in (0.2, 0.4)
    }
    for s in main:
        assert s["kl"]["n"] == 2 and s["kl"]["lo"] <= s["kl"]["mean"] <= s["kl"]["hi"]
    comps = a["random_attention"]["comparisons"]
    assert len(comps) == 4 and all(c["best"] == "snapkv" for c in comps)
    for c in comps + a["random_attention"]["protection"]:
        assert 0 <= c["p_wilcoxon"] <= 1 and 0 <= c["p_sign"] <= 1
        assert c["lo"] <= c["mean"] <= c["hi"]
    assert a["random_attention"]["verdict"] in ("supported", "contradicted", "inconclusive")
    assert a["nexus"]["verdict"] == "inconclusive"  # nexus did not run
    runs = json.loads((out / "fidelity.json").read_text())["records"]
    assert all(r.get("positions") for r in runs)

    # Resumable: a second invocation runs nothing new and reports the same numbers.
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, again.output
    assert "(0 min)" in again.output or "0 tokens" in again.output
    assert len(json.loads((out / "fidelity.json").read_text())["records"]) == len(runs)
    assert json.loads((out / "study.json").read_text())["settings"] == a["settings"]


def test_study_rejects_token_budgets_before_loading_a_model(tmp_path, jsonl_file):
    from kvagent.cli.app import app

    res = CliRunner().invoke(app, ["bench", "study", "--model", "no-such-model", "--episodes", str(jsonl_file),
                                   "--budgets", "512", "--out", str(tmp_path)])  # fmt: skip
    assert res.exit_code == 2
    assert "fractions in (0,1)" in res.output


def test_the_margin_by_position_does_not_depend_on_hash_order(tmp_path):
    """The same records give the same CIs in every process: string hashing (hence set order) is
    seeded per process, and `--report-only` must reprint what the run printed."""
    import os
    import subprocess
    import sys

    recs = _records(8, {"nexus": 0.3, "h2o": 0.4}, growth={"nexus": 0.05})
    rng = np.random.default_rng(1)
    for r in recs:  # uneven margins per episode and bucket, so the resampled order matters
        for row in r["positions"]:
            row[2] += float(rng.normal(0, 0.2))
    path = tmp_path / "recs.json"
    path.write_text(json.dumps(recs))
    code = (
        "import json, sys\n"
        "from kvagent.bench.study import StudyPlan\n"
        "from kvagent.bench.study_analysis import analyse\n"
        "plan = StudyPlan(policies=('nexus', 'h2o'), modes=('persistent',), fractions=(0.2,), seeds=(0, 1),\n"
        "                 ablation_fraction=0.2, ablation_protects=('sink',))\n"
        "recs = json.load(open(sys.argv[1]))\n"
        "print(json.dumps(analyse(recs, plan)['nexus']['by_position']['rows']))\n"
    )
    outs = [
        subprocess.run(
            [sys.executable, "-c", code, str(path)],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": str(h)},
        ).stdout  # fmt: skip
        for h in (1, 2, 3, 4)
    ]
    assert json.loads(outs[0]) and all(o == outs[0] for o in outs), outs
