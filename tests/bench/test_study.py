"""`kvagent bench study`: the statistics, the two pre-registered designs, their verdict rules, the
resume guard, and (the acceptance smoke) both designs end to end on a tiny model."""

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from kvagent.bench import replay as rp
from kvagent.bench.episodes import from_messages
from kvagent.bench.stream import build_stream
from kvagent.bench.study.design import DESIGNS, NEXUS, RANDOM, budget_for, eligibility, select
from kvagent.bench.study.power import plan_power, power_equivalence, power_one_sided
from kvagent.bench.study.run import (
    check_resume,
    clip_messages,
    position_buckets,
    replay_tokens,
    save_selection,
    scored_positions,
    specs_for,
    template_grid,
)
from kvagent.bench.study.stats import holm, mean_ci, paired, shift, trend
from kvagent.errors import ConfigError
from kvagent.runspec import RunSpec
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


def test_paired_sees_a_consistent_shift_that_unpaired_noise_hides():
    rng = np.random.default_rng(0)
    base = rng.normal(0, 5, 12)
    p = paired(base + 0.3, base)
    assert p.excludes_zero() and p.diff.lo > 0 and p.above == 12
    assert 0 <= p.p_wilcoxon < 0.01 and 0 <= p.p_sign < 0.01
    with pytest.raises(ValueError):
        paired([1.0], [1.0, 2.0])


def test_trend_finds_a_slope_and_none_in_flat_data():
    x = np.arange(20.0)
    t = trend(x, 2 * x + np.random.default_rng(0).normal(0, 0.1, 20))
    assert t.slope == pytest.approx(2, abs=0.05) and t.p_slope < 1e-6
    assert math.isnan(trend(x, np.ones(20)).slope)


def test_tost_declares_equivalence_only_inside_the_margin():
    rng = np.random.default_rng(3)
    near = shift(rng.normal(0.0, 0.1, 40), margin=0.2)
    assert near.p_equivalent < 0.01 and near.lo90 > -0.2 and near.hi90 < 0.2
    assert near.lo95 <= near.lo90 <= near.mean <= near.hi90 <= near.hi95
    far = shift(rng.normal(0.3, 0.1, 40), margin=0.2)  # consistently 0.3 above: beyond the margin
    assert far.p_equivalent > 0.5 and far.p_beyond_above < 0.01 and far.p_above < 1e-6
    assert far.p_below > 0.99
    below = shift(rng.normal(-0.05, 0.02, 30), margin=0.2)
    assert below.p_below < 1e-6 and below.p_within_below < 1e-6  # below zero, above -margin
    for s in (near, far, below):
        for p in (s.p_equivalent, s.p_below, s.p_above, s.p_within_below, s.p_beyond_above):
            assert 0 <= p <= 1


def test_holm_is_the_step_down_adjustment():
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    raw = [0.2, 0.001, 0.04, 0.5, 0.012]
    adj = holm(raw)
    assert all(a >= r for a, r in zip(adj, raw, strict=True))
    order = sorted(range(len(raw)), key=raw.__getitem__)
    assert [adj[i] for i in order] == sorted(adj)  # monotone in the raw order
    assert holm([0.9, 0.3]) == pytest.approx([0.9, 0.6]) and holm([0.9, 0.8]) == [1.0, 1.0] and holm([]) == []


def test_power_lower_bound_holds_by_simulation_and_the_count_is_the_smallest():
    from scipy import stats

    rng = np.random.default_rng(0)
    n, sd, margin, alpha = 15, 0.25, math.log(1.25), 0.05 / 4
    hits = 0
    for _ in range(2000):
        d = rng.normal(0.0, sd, n)
        lo = stats.ttest_1samp(d, -margin, alternative="greater").pvalue
        hi = stats.ttest_1samp(d, margin, alternative="less").pvalue
        hits += max(lo, hi) < alpha
    assert hits / 2000 >= power_equivalence(n, sd, margin, alpha) - 0.03
    hits = sum(stats.ttest_1samp(rng.normal(0.0, sd, n), -margin, alternative="greater").pvalue < alpha
               for _ in range(2000))  # fmt: skip
    assert hits / 2000 == pytest.approx(power_one_sided(n, sd, margin, alpha), abs=0.03)
    plan = plan_power("equivalence", 0.26, math.log(1.25), 0.05, 4, 0.8)
    assert plan.power(plan.needed) >= 0.8 > plan.power(plan.needed - 1)
    assert plan_power("equivalence", 0.4, math.log(1.25), 0.05, 4, 0.8).needed > plan.needed
    assert plan.reachable_margin(plan.needed) <= plan.margin < plan.reachable_margin(plan.needed - 2)


# ----------------------------------------------------------------------- the designs
def test_the_designs_are_the_documented_ones():
    assert set(DESIGNS) == {"random", "nexus"}
    assert (RANDOM.buffer, RANDOM.fractions, RANDOM.family, RANDOM.test) == (64, (0.25,), 4, "equivalence")
    assert {a.protect for a in RANDOM.arms if "sink" not in a.name} == {"prompt"}
    assert RANDOM.named == ("triattention", "snapkv") and RANDOM.n_episodes == 20
    assert (NEXUS.buffer, NEXUS.fractions, NEXUS.family, NEXUS.test) == (32, (0.1, 0.2), 10, "superiority")
    assert NEXUS.n_episodes == 14 and NEXUS.trend_against == "nexus n=0"
    assert RANDOM.framework == NEXUS.framework == "recent-buffer"
    for d in DESIGNS.values():
        assert len(d.seeds) >= 2 and d.arm(d.subject).seeded
    # The protection ablation of nexus really removes its sink (protect alone does not).
    assert dict(NEXUS.arm("nexus (no sink)").policy_args)["sink_blocks"] == 0


def test_the_grid_runs_the_primary_family_first_and_seeds_only_the_draws():
    for d in DESIGNS.values():
        g = template_grid(d)
        assert g[0].policy == "full"
        first = g[1 : 1 + len(d.primary_modes) * len(d.fractions) * (1 + len(d.named))]
        assert {d.arm_of({"policy": s.policy, "protect": s.protect, "policy_args": s.policy_args}).name
                for s in first} == {d.subject, *d.named}  # fmt: skip
        assert {s.mode for s in first} == set(d.primary_modes) and {s.seed for s in first} == {0}
        for s in g[1:]:
            arm = d.arm_of({"policy": s.policy, "protect": s.protect, "policy_args": s.policy_args})
            assert arm is not None and s.seed in d.seeds_of(arm) and s.buffer == d.buffer
        assert len(g) == len(set(g)) and len({(s.label, s.seed, str(s.policy_args)) for s in g}) == len(g)
    nexus_specs = [s for s in template_grid(NEXUS) if s.policy == "nexus"]
    assert {s.policy_args.get("n") for s in nexus_specs} == {5, 0}
    assert [(s.mode, s.budget) for s in nexus_specs if s.protect == "none"] == [("persistent", 0.1)]


def test_budgets_are_a_block_multiple_of_each_episode(tiny_engine, episode_record):
    block = common_block()
    assert budget_for(0.2, 10_000) % block == 0 and abs(budget_for(0.2, 10_000) - 2000) <= block / 2
    assert budget_for(0.01, 100) == block
    stream = build_stream(from_messages("e", episode_record(turns=12)["messages"]), tiny_engine.tokenizer)
    ks = {s.budget for s in specs_for(RANDOM, stream) if s.policy != "full"}
    assert ks == {budget_for(0.25, len(stream.ids))}


def test_eligibility_and_selection_follow_the_rule_in_file_order(tiny_engine, episode_record):
    def stream(name, turns):
        return build_stream(from_messages(name, episode_record(name, turns=turns)["messages"]),
                            tiny_engine.tokenizer, max_tokens=RANDOM.max_tokens)  # fmt: skip

    streams = [stream("a", 12), stream("short", 6), stream("b", 13), stream("c", 12), stream("d", 14)]
    assert "tokens < 2048" in eligibility(RANDOM, streams[1]).reason
    assert eligibility(RANDOM, streams[0]).reason is None
    few = replace(RANDOM, pilot_sd=0.01)  # a tiny SD: the power calculation asks for 3 episodes
    chosen, rows = select(few, streams)
    assert few.n_episodes == 3 and [s.name for s in chosen] == ["a", "b", "c"] and len(rows) == 5
    # The prompt-share rule: the same episode with a long prompt is refused.
    long = episode_record("long", turns=12)
    long["messages"][1]["content"] = "Fix the bug. " * 120
    st = build_stream(from_messages("long", long["messages"]), tiny_engine.tokenizer, max_tokens=3072)
    assert "prompt" in eligibility(RANDOM, st).reason
    with pytest.raises(ConfigError, match="share a name"):
        select(RANDOM, [streams[1], streams[1]])


def test_clip_cuts_the_prompt_and_the_rest_to_their_own_limits(episode_record):
    long = episode_record(turns=3)
    long["messages"][0]["content"] = "s" * 3000
    long["messages"][3]["content"] = "x" * 5000  # the first observation, where the fact is planted
    ep = from_messages("e", long["messages"])
    both = clip_messages(ep, 400)
    assert all(len(m["content"]) <= 440 for m in both.messages)
    split = clip_messages(ep, 2000, 100)
    assert len(split.messages[0]["content"]) <= 140 and 1000 < len(split.messages[3]["content"]) <= 2040
    assert "characters cut" in split.messages[3]["content"] and "7319-AXQ" in split.messages[3]["content"]
    whole_rest = clip_messages(ep, None, 100)
    assert whole_rest.messages[3]["content"] == ep.messages[3]["content"]


def test_position_buckets_follow_the_scored_tokens(tiny_engine, episode_record):
    stream = build_stream(from_messages("e", episode_record(turns=6)["messages"]), tiny_engine.tokenizer)
    pos = scored_positions(stream)
    assert len(pos) == stream.n_scored and [stream.ids[p] for p in pos] == rp.scored_targets(stream)
    res = rp.ReplayResult(kl=[float(p) for p in pos], agree=[True] * len(pos), logp_true=[0.0] * len(pos))
    b = position_buckets(stream, res, 128)
    assert sum(row[1] for row in b) == len(pos)
    for start, n, kl, top1, _ in b:
        inside = [p for p in pos if start <= p < start + 128]
        assert n == len(inside) and kl == pytest.approx(sum(inside) / n) and top1 == 1.0


@pytest.mark.parametrize("reuse", [True, False])
@pytest.mark.parametrize("mode", ["reprefill", "persistent"])
def test_replay_tokens_are_what_a_run_pushes_through_the_model(tiny_engine, episode_record, reuse, mode):
    """The estimate's token count is the run's own: prefill (rebuilds included, less what reuse
    restored) plus decode, probe included."""
    stream = build_stream(from_messages("e", episode_record(turns=8)["messages"]), tiny_engine.tokenizer)
    assert len(stream.ids) > 1024 and stream.probe is not None
    spec = RunSpec("snapkv", budget=96, buffer=32, protect="sink", mode=mode)
    res = rp.replay(tiny_engine, stream, spec.cache_config(), lambda *a: None, reuse_prefix=reuse)
    st = res.stats
    assert replay_tokens(stream, spec, reuse) == st["prefill_tokens"] + st["decode_tokens"]
    assert (st["reused_tokens"] > 0) == (reuse and mode == "reprefill")


# ----------------------------------------------------------------------- resuming
def _record(**kw):
    base = {"status": "ok", "model": "m", "episode": "e", "policy": "random", "protect": "prompt", "mode":
            "persistent", "budget": 704, "buffer": 64, "window": 16, "seed": 0, "tokens": 2816,
            "framework": RANDOM.framework}  # fmt: skip
    return {**base, **kw}


@pytest.mark.parametrize(
    ("record", "needle"),
    [
        (_record(buffer=128), "r=128"),
        (_record(window=32), "W=32"),
        (_record(framework="something-else"), "framework=something-else"),
        # A record from before the setting existed ran kvagent's earlier scheme.
        ({k: v for k, v in _record().items() if k != "framework"}, "framework=topk-all"),
        (_record(policy="full", budget=None, buffer=32), "r=32"),
    ],
)
def test_resume_refuses_runs_of_another_buffer_window_or_framework(tmp_path, record, needle):
    (tmp_path / "fidelity.json").write_text(json.dumps({"records": [_record(), record]}))
    with pytest.raises(ConfigError, match="never mixes") as e:
        check_resume(RANDOM, tmp_path, "m")
    assert needle in str(e.value) and "\n" not in str(e.value)
    check_resume(RANDOM, tmp_path, "other-model")  # another model's records are not this study's


def test_resume_accepts_its_own_runs_and_refuses_another_claims_directory(tmp_path):
    (tmp_path / "fidelity.json").write_text(json.dumps({"records": [_record()]}))
    check_resume(RANDOM, tmp_path, "m")
    save_selection(tmp_path, NEXUS, [], [])
    with pytest.raises(ConfigError, match="holds the nexus study"):
        check_resume(RANDOM, tmp_path, "m")


# ----------------------------------------------------------------------- verdict rules
def _synthetic(design, kl: dict, n_eps: int = 14, noise: float = 0.05, growth: dict | None = None):
    """Records of `design` on n_eps 4000-token episodes: each arm's KL = kl[arm] x episode factor x
    noise; position buckets (32 tokens) hold the margin's growth per arm after the first eviction."""
    rng = np.random.default_rng(7)
    out = []
    for e in range(n_eps):
        hard = float(rng.uniform(0.5, 2.0))  # episodes differ a lot in difficulty
        base = {"status": "ok", "model": "m", "episode": f"ep{e:02d}", "tokens": 4000, "prompt_tokens": 200,
                "turns": 5, "n_scored": 400, "buffer": design.buffer, "window": design.window, "top1": 0.5,
                "logp_true": -1.0, "probe_retrieved": e % 2 == 0, "probe_logp": -2.0, "n_layers": 2}  # fmt: skip
        out.append({**base, "policy": "full", "budget": None, "seed": 0, "mode": "persistent", "kl": 0.0,
                    "protect": "prompt"})  # fmt: skip
        for arm in design.arms:
            for mode in design.modes_of(arm):
                for f in design.fractions_of(arm):
                    for seed in design.seeds_of(arm):
                        k = budget_for(f, 4000)
                        v = kl.get(arm.name, 1.0) * hard * float(np.exp(rng.normal(0, noise)))
                        g = (growth or {}).get(arm.name, 0.0)
                        pos = [[b, 8, (0.0 if b < k + design.buffer else v - g * b / 1000), 0.5, -1.0]
                               for b in range(0, 4000, 32)]  # fmt: skip
                        out.append({**base, "policy": arm.policy, "protect": arm.protect, "mode": mode,
                                    "policy_args": dict(arm.policy_args), "budget": k, "seed": seed, "kl": v,
                                    "positions": pos})  # fmt: skip
    return out


@pytest.mark.parametrize(
    ("kl", "verdict"),
    [
        ({"random": 1.0, "triattention": 1.02, "snapkv": 0.98}, "supported"),  # within x1.25
        ({"random": 0.5, "triattention": 1.0, "snapkv": 0.52}, "supported"),  # better than one
        ({"random": 2.0, "triattention": 1.0, "snapkv": 1.0}, "contradicted"),  # 2x worse
        ({"random": 1.22, "triattention": 1.0, "snapkv": 1.0}, "inconclusive"),  # worse, not beyond 1.25
    ],
)
def test_random_verdict_rule(kl, verdict):
    from kvagent.bench.study.verdicts import analyse

    a = analyse(_synthetic(RANDOM, kl, n_eps=20), RANDOM)
    assert a["verdict"] == verdict, a["sentence"]
    assert len(a["primary"]) == RANDOM.family and a["interim"] is None
    for c in a["primary"]:
        assert c["holm_equivalent"] >= c["p_equivalent"] and c["holm_better"] >= c["p_below"]


def test_random_verdict_is_interim_while_the_family_is_unfinished():
    from kvagent.bench.study.verdicts import analyse

    recs = [r for r in _synthetic(RANDOM, {"random": 1.0}, n_eps=20)
            if not (r["policy"] == "snapkv" and r["mode"] == "reprefill" and r["episode"] == "ep03")]  # fmt: skip
    a = analyse(recs, RANDOM, episodes=[f"ep{e:02d}" for e in range(20)])
    assert a["interim"] and "19 of 20 chosen episodes" in a["interim"] and "5 of 6 primary" in a["interim"]
    assert a["verdict"] == "none yet" and a["progress"]["episodes_done"] == 19


def test_no_verdict_before_the_planned_episodes_have_run():
    """Half of the chosen episodes done, every primary setting on them: the numbers would say
    supported, but the report is interim (n of N) and states no verdict; a missing secondary arm
    does not hold the verdict back."""
    from kvagent.bench.study.report import render
    from kvagent.bench.study.verdicts import analyse

    recs = _synthetic(RANDOM, {"random": 1.0, "triattention": 1.02, "snapkv": 0.98}, n_eps=20)
    chosen = [f"ep{e:02d}" for e in range(20)]
    half = [r for r in recs if int(r["episode"][2:]) < 10]
    a = analyse(half, RANDOM, episodes=chosen)
    assert a["verdict"] == "none yet" and "10 of 20 chosen episodes" in a["interim"]
    assert len(a["primary"]) == RANDOM.family and all(c["n"] == 10 for c in a["primary"])  # numbers so far
    md = render(a)
    assert "Interim report, no verdict yet: 10 of 20 episodes done" in md and "Verdict:" not in md
    assert "— interim" in md.splitlines()[0]
    no_tova = [r for r in recs if r["policy"] != "tova"]
    full = analyse(no_tova, RANDOM, episodes=chosen)
    assert full["interim"] is None and full["verdict"] == "supported"
    assert "**Verdict: supported**" in render(full)


@pytest.mark.parametrize(
    ("kl", "growth", "verdict"),
    [
        # nexus 30% below every baseline, its edge over n=0 growing along the episode
        ({"nexus": 0.7}, {"nexus": 0.05}, "supported"),
        ({"nexus": 0.7}, {}, "inconclusive"),  # better, but the margin does not grow
        ({"nexus": 1.0}, {"nexus": 0.05}, "contradicted"),  # no better than n=0 by the margin
        ({"nexus": 1.5}, {}, "contradicted"),  # worse
    ],
)
def test_nexus_verdict_rule(kl, growth, verdict):
    from kvagent.bench.study.verdicts import analyse

    a = analyse(_synthetic(NEXUS, kl, n_eps=14, growth=growth), NEXUS)
    assert a["verdict"] == verdict, a["sentence"]
    t = a["trends"][0]
    assert t["baseline"] == "nexus n=0" and t["n"] == 14  # one slope per episode, not pooled buckets
    if growth:
        assert t["mean"] == pytest.approx(0.05, rel=0.01)  # KL falls by 0.05 per 1k tokens


def test_trend_starts_at_the_first_eviction():
    """Buckets before K + r saw the full cache (margin 0): a huge value planted there must not move
    the slope, while the same value after the first eviction does."""
    from kvagent.bench.study.verdicts import analyse

    def planted(at_start: bool):
        recs = _synthetic(NEXUS, {"nexus": 0.7}, n_eps=6, noise=0.0)
        for r in recs:
            if r["policy"] == "nexus" and r.get("policy_args", {}).get("n") == 5:
                k = r["budget"] + NEXUS.buffer
                row = r["positions"][0 if at_start else k // 32 + 1]
                row[2] = -50.0  # nexus far better in that bucket
        return analyse(recs, NEXUS)["trends"][0]["mean"]

    clean = analyse(_synthetic(NEXUS, {"nexus": 0.7}, n_eps=6, noise=0.0), NEXUS)["trends"][0]["mean"]
    assert planted(True) == pytest.approx(clean)
    assert planted(False) != pytest.approx(clean)


def test_first_eviction_splits_k_with_the_records_window():
    """PyramidKV reserves the window in every layer, so its smallest layer's K (where the trend
    starts) depends on the record's window, not the policy's default one."""
    from kvagent.bench.study.analysis import first_eviction
    from kvagent.runtime.policies.pyramidkv import pyramid_budgets

    rec = {"policy": "pyramidkv", "budget": 256, "buffer": 32, "window": 64, "n_layers": 4}
    smallest = min(pyramid_budgets(256, 4, 20.0, window=64))
    assert smallest != min(pyramid_budgets(256, 4, 20.0, window=16))  # the window matters here
    assert first_eviction(rec) == smallest + 32 + 1
    # policy_args' own window wins over the record's, as in the session
    own = {**rec, "policy_args": {"window": 16}}
    assert first_eviction(own) == min(pyramid_budgets(256, 4, 20.0, window=16)) + 32 + 1


def test_the_analysis_does_not_depend_on_hash_order(tmp_path):
    """The same records give the same numbers in every process: set order changes with each
    process's string hashing, and `--report-only` must reprint what the run printed."""
    import os
    import subprocess
    import sys

    path = tmp_path / "recs.json"
    path.write_text(json.dumps(_synthetic(NEXUS, {"nexus": 0.8}, n_eps=5, growth={"nexus": 0.01})))
    code = (
        "import json, sys\n"
        "from kvagent.bench.study.design import NEXUS\n"
        "from kvagent.bench.study.verdicts import analyse\n"
        "a = analyse(json.load(open(sys.argv[1])), NEXUS)\n"
        "print(json.dumps([a['trends'], a['settings'], a['primary']]))\n"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code, str(path)],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": str(h)},
        ).stdout  # fmt: skip
        for h in (1, 2, 3)
    }
    assert len(outs) == 1


# ----------------------------------------------------------------------- the smoke study (CLI)
def _varied(episode_record, k: int, turns: int) -> dict:
    """Fixture episodes that differ from each other (so the statistics have a spread)."""
    r = episode_record(f"fixture-{k}", turns=turns)
    for i, m in enumerate(r["messages"]):
        if m["role"] == "tool":
            m["content"] = m["content"].replace("x *", f"x * {k + 1} *") + f"\n# note {k * i}" * (
                1 + (k + i) % 3
            )
    return r


# Both designs as pre-registered, shortened for a tiny model on a loaded CPU: episodes of 2-3 turns
# and a few hundred tokens (cut and eligibility scaled alike), r = 32, 16-token position buckets.
SMOKE = {"random": (3, 480, 2), "nexus": (4, 700, 3)}  # fixture turns, cut, eligible turns


def _smoke(claim: str, **kw):
    fixture_turns, cut, turns = SMOKE[claim]
    return fixture_turns, replace(DESIGNS[claim], max_tokens=cut, min_tokens=cut // 2, min_turns=turns,
                                  buffer=32, fine_bucket=16, shown_bucket=128, **kw)  # fmt: skip


@pytest.mark.parametrize("claim", ["random", "nexus"])
def test_smoke_study_computes_every_statistic(tmp_path, episode_record, monkeypatch, claim):
    from typer.testing import CliRunner

    from kvagent.bench.study import design as study_design
    from kvagent.bench.study.report import SECTIONS
    from kvagent.cli.app import app

    turns, design = _smoke(claim)
    monkeypatch.setitem(study_design.DESIGNS, claim, design)
    eps = tmp_path / "eps.jsonl"
    eps.write_text("".join(json.dumps(_varied(episode_record, k, turns)) + "\n" for k in range(3)))
    out = tmp_path / "study"
    args = ["bench", "study", "--claim", claim, "--model", "tiny-random-qwen3", "--device", "cpu",
            "--episodes", str(eps), "--out", str(out), "--quiet"]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "episodes for power 80%" in res.output and "estimated" in res.output
    a = json.loads((out / "study.json").read_text())
    assert {e["episode"] for e in a["episodes"]} == {"fixture-0", "fixture-1", "fixture-2"}
    assert a["verdict"] in ("supported", "contradicted", "inconclusive") and a["interim"] is None
    # Every statistic is computed: CIs around their estimates, p-values in [0, 1], Holm applied.
    assert len(a["primary"]) == design.family
    holm_keys = {"holm_equivalent", "holm_better", "holm_worse"} if claim == "random" else {
        "holm_better", "holm_worse", "holm_not_better"}  # fmt: skip
    for c in a["primary"] + a["secondary"] + a["ablation"]:
        assert c["n"] == 3 and c["lo95"] <= c["lo90"] <= c["mean"] <= c["hi90"] <= c["hi95"]
        assert c["boot"]["lo"] <= c["boot"]["mean"] <= c["boot"]["hi"]
        for k in (
            "p_equivalent",
            "p_below",
            "p_above",
            "p_within_below",
            "p_beyond_above",
            "p_wilcoxon",
            "p_sign",
        ):
            assert 0 <= c[k] <= 1, (k, c)
    for c in a["primary"]:
        assert holm_keys <= set(c) and c["outcome"]
    from kvagent.bench.study.stats import holm

    for key, raw in (
        ("holm_better", "p_below"),
        ("holm_worse", "p_above" if claim == "nexus" else "p_beyond_above"),
    ):
        assert [c[key] for c in a["primary"]] == pytest.approx(holm([c[raw] for c in a["primary"]]))
    assert len(a["secondary"]) > 0 and len(a["ablation"]) > 0
    if claim == "nexus":
        (t, *_others) = a["trends"]
        assert t["n"] == 3 and t["lo95"] <= t["mean"] <= t["hi95"] and 0 <= t["p_grows"] <= 1
        first = min(e["k"]["0.1"] for e in a["episodes"]) + design.buffer  # the earliest first eviction
        assert min(r["bucket"] for r in t["rows"]) >= first // design.shown_bucket * design.shown_bucket
        assert a["interaction"] and (out / "study_position.png").stat().st_size > 1000
    # The probe per arm, and the per-episode tables.
    assert {s["arm"] for s in a["settings"]} == {x.name for x in design.arms}
    assert all(s["probe"]["runs"] > 0 for s in a["settings"])
    md = (out / "study.md").read_text()
    for section in SECTIONS:
        assert section in md
    assert all(f"fixture-{k}" in (out / "episodes.md").read_text() for k in range(3))
    for png in ("study_contrasts.png", "study_kl.png"):
        assert (out / png).stat().st_size > 1000

    # Resumable: a second invocation runs nothing new and reports the same numbers.
    runs = json.loads((out / "fidelity.json").read_text())["records"]
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, again.output
    assert " 0 tokens" in again.output or "(0 min)" in again.output
    assert len(json.loads((out / "fidelity.json").read_text())["records"]) == len(runs)
    assert json.loads((out / "study.json").read_text())["primary"] == a["primary"]
    # The other claim's design refuses this directory (its r differs).
    other = "nexus" if claim == "random" else "random"
    monkeypatch.setitem(study_design.DESIGNS, other, replace(DESIGNS[other], buffer=8))
    refused = CliRunner().invoke(app, [*args[:3], other, *args[4:]])
    assert refused.exit_code == 2 and f"holds the {claim} study" in refused.output


def test_study_refuses_an_unknown_claim_before_loading_a_model(tmp_path, jsonl_file):
    from typer.testing import CliRunner

    from kvagent.cli.app import app

    res = CliRunner().invoke(app, ["bench", "study", "--claim", "streaming", "--model", "no-such-model",
                                   "--episodes", str(jsonl_file), "--out", str(tmp_path)])  # fmt: skip
    assert res.exit_code == 2 and "claim: got 'streaming'" in res.output


def test_a_stopped_study_continues_where_it_stopped(tmp_path, episode_record, monkeypatch, study_cli):
    """Stopped after 3 of its 8 policy runs (Ctrl-C, SIGTERM: the same KeyboardInterrupt), the study
    keeps those runs; `--report-only` then writes an interim report (0 of 2 episodes, no verdict); the
    same command again runs exactly the 5 missing ones, and the report is final. A design of another r
    or framework refuses the directory."""
    from typer.testing import CliRunner

    from kvagent.bench.study import design as study_design
    from kvagent.cli.app import app

    arms = tuple(RANDOM.arm(n) for n in ("random", "triattention", "snapkv"))
    turns, tiny = _smoke(
        "random", arms=arms, ablations=(), modes=("persistent",), primary_modes=("persistent",)
    )
    monkeypatch.setitem(study_design.DESIGNS, "random", tiny)
    eps = tmp_path / "eps.jsonl"
    eps.write_text("".join(json.dumps(_varied(episode_record, k, turns)) + "\n" for k in range(2)))
    out = tmp_path / "study"
    args = study_cli.args("random", eps, out)
    calls = study_cli.stop_after(3)
    stopped = CliRunner().invoke(app, args)
    assert stopped.exit_code == 130 and "rerun the same command to resume" in stopped.output
    kept = json.loads((out / "fidelity.json").read_text())["records"]
    assert sorted(r["policy"] for r in kept) == ["full", "full", "random", "random", "triattention"]
    assert {r["framework"] for r in kept if r["policy"] != "full"} == {"recent-buffer"}

    report = CliRunner().invoke(app, [*args, "--report-only"])
    assert report.exit_code == 0, report.output
    a = json.loads((out / "study.json").read_text())
    assert a["verdict"] == "none yet" and a["progress"]["episodes_done"] == 0
    assert a["progress"]["episodes_planned"] == 2 and "0 of 2 chosen episodes" in a["interim"]
    assert "Interim report, no verdict yet: 0 of 2 episodes done" in (out / "study.md").read_text()

    calls = study_cli.count()
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, again.output
    assert len(calls) == 5  # only the missing runs
    recs = json.loads((out / "fidelity.json").read_text())["records"]
    assert len(recs) == 10 and len({(r["episode"], r["policy"], r["seed"]) for r in recs}) == 10
    a = json.loads((out / "study.json").read_text())
    assert a["interim"] is None and a["verdict"] != "none yet" and a["progress"]["episodes_done"] == 2

    for other in (replace(tiny, buffer=8), replace(tiny, framework="topk-all")):
        monkeypatch.setitem(study_design.DESIGNS, "random", other)
        refused = CliRunner().invoke(app, args)
        assert refused.exit_code == 2 and "never mixes" in refused.output, refused.output
