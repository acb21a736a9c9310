"""Each claim's verdict from its pre-registered family (rules stated in docs/study.md, "Design",
before any result), and `analyse`: every number the report shows, as one dict.

Random Attention (test "equivalence", margin delta on d = log(KL_random / KL_baseline)), per named
baseline and mode, Holm-adjusted over that family: *equivalent* (TOST p < alpha), else *better*
(H0: mu >= 0 rejected), else *worse beyond the margin* (H0: mu <= delta rejected), else *undecided*.
Supported: every named comparison equivalent or better. Contradicted: any one worse beyond the
margin. Otherwise inconclusive.

Nexus Sampling (test "superiority", persistent mode, both budgets, Holm over the named baselines x
budgets): *better* (H0: mu >= 0 rejected), *worse* (H0: mu <= 0 rejected), *not better by the
margin* (H0: mu <= -delta rejected: any advantage is smaller than the factor e^delta), else
*undecided*. Supported: better than every named baseline at every budget, and the margin over n=0
grows with position (mean per-episode slope > 0, one-sided p < alpha). Contradicted: against n=0
(the contrast that isolates sampling from the score) worse or not better by the margin at every
budget. Otherwise inconclusive.

Before the primary family has run on every chosen episode (the count the power calculation fixed),
the report is interim: it says how many of them are done and gives the numbers so far, no verdict."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict

from kvagent.bench.study.analysis import (
    Table,
    _ci,
    episodes_of,
    family,
    margin_trend,
    per_episode,
    probe_of,
    settings,
)
from kvagent.bench.study.design import Design
from kvagent.bench.study.stats import mean_ci, shift
from kvagent.runspec import RunSpec

INTERIM = "none yet"  # the verdict while the primary family has not run on every chosen episode


def _ratio(c: Mapping) -> str:
    return (
        f"{c['ratio']:.3f} [{math.exp(c['lo95']):.3f}, {math.exp(c['hi95']):.3f}]"
        if c["n"] > 1
        else f"{c['ratio']:.3f}"
    )


def _holm_p(c: Mapping) -> float:
    """The Holm-adjusted p behind a row's outcome (the smallest of its tests when undecided)."""
    key = {"equivalent": "holm_equivalent", "better": "holm_better", "worse beyond the margin": "holm_worse",
           "worse": "holm_worse", "not better by the margin": "holm_not_better"}.get(c["outcome"])  # fmt: skip
    if key:
        return c[key]
    return min(v for k, v in c.items() if k.startswith("holm_"))


def _list(rows: Sequence[Mapping], with_mode: bool) -> str:
    return "; ".join(
        f"vs {c['baseline']} ({c['mode'] + ', ' if with_mode else ''}K={c['fraction']:g}): ratio {_ratio(c)}, "
        f"{c['outcome']} (Holm p={_holm_p(c):.3g})"
        for c in rows
    )


def random_verdict(design: Design, rows: Sequence[Mapping]) -> tuple[str, str]:
    if not rows:
        return "inconclusive", "no primary comparison has run yet."
    if any(c["outcome"] == "worse beyond the margin" for c in rows):
        verdict = "contradicted"
    elif len(rows) == design.family and all(c["outcome"] in ("equivalent", "better") for c in rows):
        verdict = "supported"
    else:
        verdict = "inconclusive"
    n = min(c["n"] for c in rows)
    return verdict, (
        f"KL(random) / KL(baseline), geometric mean over n={n} episodes [95% CI], within the margin "
        f"{math.exp(design.margin):.2f}: {_list(rows, True)}."
    )


def nexus_verdict(design: Design, rows: Sequence[Mapping], trend: Mapping) -> tuple[str, str]:
    if not rows:
        return "inconclusive", "no primary comparison has run yet."
    core = [c for c in rows if c["baseline"] == design.trend_against]
    grows = trend["n"] > 1 and trend["p_grows"] < design.alpha
    all_better = len(rows) == design.family and all(c["outcome"] == "better" for c in rows)
    if all_better and grows:
        verdict = "supported"
    elif len(core) == len(design.fractions) and all(
        c["outcome"] in ("worse", "not better by the margin") for c in core
    ):
        verdict = "contradicted"
    else:
        verdict = "inconclusive"
    slope = "n/a" if trend["n"] < 2 else (
        f"{trend['mean']:+.4f} [{trend['lo95']:+.4f}, {trend['hi95']:+.4f}] KL per 1k tokens "
        f"(one-sided p={trend['p_grows']:.3g}, n={trend['n']})"
    )  # fmt: skip
    return verdict, (
        f"KL(nexus) / KL(baseline), persistent, geometric mean [95% CI] (below 1: nexus better; margin "
        f"{math.exp(design.margin):.2f}): {_list(rows, False)}; the margin over {design.trend_against} "
        f"from the first eviction on changes by {slope}."
    )


def progress(design: Design, table: Table, episodes: Sequence[str]) -> dict:
    """How far the primary family has got: the chosen episodes on which every primary setting (the
    subject with all its seeds and each named baseline, in every primary mode and budget) has run,
    and the primary settings finished over all of them."""
    keys = [(a, m, f) for a in (design.subject, *design.named) for m in design.primary_modes
            for f in design.fractions]  # fmt: skip
    done = [e for e in episodes if all(table.complete(k, [e]) for k in keys)]
    settings_done = sum(table.complete(k, episodes) for k in keys) if episodes else 0
    return {"episodes_done": len(done), "episodes_planned": len(episodes), "settings_done": settings_done,
            "settings": len(keys)}  # fmt: skip


def _interim(p: Mapping) -> str | None:
    if p["episodes_planned"] and p["episodes_done"] == p["episodes_planned"]:
        return None
    return (
        f"interim: the primary family has finished on {p['episodes_done']} of {p['episodes_planned']} chosen "
        f"episodes ({p['settings_done']} of {p['settings']} primary settings over all of them); no verdict "
        f"before all {p['episodes_planned']}, the pre-registered count"
    )


def analyse(records: Sequence[Mapping], design: Design, episodes: Sequence[str] | None = None,
            not_chosen: Sequence[Mapping] = ()) -> dict:  # fmt: skip
    """Everything the report shows. `episodes`: the chosen episodes (default: those with runs);
    `not_chosen`: the others looked at, each {name, reason}."""
    eps_rows = episodes_of(records, design)
    if episodes is not None:
        wanted = set(episodes)
        records = [r for r in records if r.get("episode") in wanted]
        eps_rows = [e for e in eps_rows if e["episode"] in wanted]
    names = [e["episode"] for e in eps_rows]
    table = Table(records, design)
    subject = design.subject
    primary = family(table, [(subject, b) for b in design.named], design.primary_modes)
    rest_modes = [m for m in design.modes if m not in design.primary_modes]
    secondary = family(table, [(subject, b) for b in design.named], rest_modes)
    others = [a.name for a in design.arms if a.name not in {subject, *design.named}
              and a.name not in {x for ab in design.ablations for x in ab}]  # fmt: skip
    secondary += family(table, [(subject, b) for b in others], design.modes)
    ablation = family(table, list(design.ablations), design.modes)
    trends = []
    if design.trend_against:
        trends = [margin_trend(table, design.trend_against)]
        trends += [margin_trend(table, b) for b in design.named if b != design.trend_against]
    if design.claim == "random":
        verdict, sentence = random_verdict(design, primary)
    else:
        verdict, sentence = nexus_verdict(design, primary, trends[0])
    done = progress(design, table, list(episodes) if episodes is not None else names)
    interim = _interim(done)
    if interim:  # the rule is not applied to fewer episodes than planned: the numbers so far only
        verdict, sentence = INTERIM, f"so far, {sentence}"
    plan = design.power_plan()
    observed_sd = [c["sd"] for c in primary if c["n"] > 1]
    obs = sorted(observed_sd)[len(observed_sd) // 2] if observed_sd else None
    return {
        "design": {**asdict(design), "family_size": design.family, "margin_factor": math.exp(design.margin)},
        "power": {
            "test": plan.test,
            "assumed_sd": plan.sd,
            "margin": plan.margin,
            "family": plan.family,
            "per_test_alpha": plan.per_test_alpha,
            "target": plan.target,
            "needed": plan.needed,
            "episodes": len(names),
            "power_at_episodes": plan.power(len(names)) if names else 0.0,
            "observed_sd": obs,
            "reachable_margin_observed": plan.reachable_margin(len(names), obs) if obs is not None else None,
        },  # fmt: skip
        "framework": ", ".join(
            sorted(
                {
                    RunSpec.from_record(r).framework  # a record without it: topk-all
                    for r in records
                    if r.get("status") == "ok" and r.get("policy") != "full"
                }
            )
        )
        or "-",
        "eligibility": [dict(e) for e in not_chosen],
        "runs": sum(r.get("status") == "ok" for r in records),
        "episodes": eps_rows,
        "reference": {
            "logp": _ci(mean_ci([r["logp_true"] for r in table.full.values()])),
            "probe": probe_of(list(table.full.values())),
        },  # fmt: skip
        "settings": settings(table),
        "primary": primary,
        "secondary": secondary,
        "ablation": ablation,
        "trends": trends,
        "interaction": interaction(table, design) if rest_modes else [],
        "per_episode": per_episode(table, names),
        "verdict": verdict,
        "interim": interim,
        "progress": done,
        "sentence": sentence,
    }


def interaction(table: Table, design: Design) -> list[dict]:
    """Does the subject's edge over each named baseline differ between the modes? Per episode and
    budget, d(persistent) - d(reprefill); a t interval over episodes (secondary, no correction)."""
    out = []
    primary, other = design.primary_modes[0], next(m for m in design.modes if m not in design.primary_modes)
    for b in design.named:
        for f in design.fractions:
            vals = {}
            for mode in (primary, other):
                a, c = table.values((design.subject, mode, f)), table.values((b, mode, f))
                vals[mode] = {e: math.log(a[e] / c[e]) for e in set(a) & set(c) if a[e] > 0 and c[e] > 0}
            eps = sorted(set(vals[primary]) & set(vals[other]))
            if eps:
                s = shift([vals[primary][e] - vals[other][e] for e in eps], design.margin)
                out.append({"baseline": b, "fraction": f, "modes": [primary, other], "n": s.n, "mean": s.mean,
                            "lo95": s.lo95, "hi95": s.hi95, "p_below": s.p_below, "p_above": s.p_above})  # fmt: skip
    return out
