"""From the study's records to numbers: per-setting means with CIs, the paired comparisons each
claim rests on, the margin by position, and a verdict per claim (rules below, all on KL).

Random Attention ("with the sink protected, uniform random eviction is about as good as the best
deterministic top-K"): random minus the best deterministic policy, per mode and budget. "About as
good" = within EQUIV of the best one's KL: supported when the upper CI bound of the difference is
inside that margin everywhere, contradicted when the lower bound is beyond it (and Wilcoxon p < ALPHA)
in most settings.

Nexus ("under persistent eviction, reservoir sampling beats deterministic top-K, by more as the
context grows"): nexus minus the best deterministic policy, persistent mode. Supported when the
CI is below zero (and Wilcoxon p < ALPHA) at every budget and the margin grows with position (slope
p < ALPHA); contradicted when the CI is above zero (Wilcoxon p < ALPHA) at most budgets; otherwise,
and always below MIN_EPISODES episodes, inconclusive.

The best deterministic policy is picked per setting by its mean KL on the same episodes, so the
comparison is against the strongest baseline (a post-hoc pick, which favours the baseline)."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict

from kvagent.bench.study import PROTECT_MAIN, RANDOM_DRAW, StudyPlan, fraction_of
from kvagent.bench.study_stats import mean_ci, paired, trend

METRICS = ("kl", "top1", "logp_true")
PRIMARY = "kl"
EQUIV = 0.10  # "about as good": within 10% of the best deterministic policy's mean KL
ALPHA = 0.05
# Below this many episodes no verdict is more than "inconclusive": a bootstrap over 3 values has 10
# distinct resamples, and the Wilcoxon test cannot reach ALPHA before n = 6.
MIN_EPISODES = 6


def _finite(x) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x))


class Table:
    """Per-episode values (seeds averaged) of each (policy, mode, protect, fraction)."""

    def __init__(self, records: list[dict], plan: StudyPlan):
        fractions = sorted({*plan.fractions, plan.ablation_fraction})
        acc: dict[tuple, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
        self.full: dict[str, dict] = {}
        for r in records:
            if r.get("status") != "ok":
                continue
            if r["policy"] == "full":
                self.full[r["episode"]] = r
                continue
            for f in fraction_of(r, fractions):
                acc[(r["policy"], r["mode"], r["protect"], f)][r["episode"]].append(r)
        self.runs = acc

    def values(self, key: tuple, metric: str = PRIMARY) -> dict[str, float]:
        out = {}
        for ep, rs in self.runs.get(key, {}).items():
            xs = [r[metric] for r in rs if _finite(r.get(metric))]
            if xs:
                out[ep] = sum(xs) / len(xs)
        return out

    def buckets(self, key: tuple) -> dict[str, dict[int, float]]:
        """episode -> {bucket start: KL}, seeds averaged."""
        out: dict[str, dict[int, float]] = {}
        for ep, rs in self.runs.get(key, {}).items():
            acc: dict[int, list[float]] = defaultdict(list)
            for r in rs:
                for start, _n, kl, _a, _lp in r.get("positions") or []:
                    acc[int(start)].append(kl)
            out[ep] = {b: sum(v) / len(v) for b, v in acc.items()}
        return out

    def keys(self):
        return list(self.runs)


def _ci(c) -> dict:
    return {"mean": c.mean, "lo": c.lo, "hi": c.hi, "n": c.n}


def _paired(a: dict[str, float], b: dict[str, float]) -> dict | None:
    common = sorted(set(a) & set(b))
    if not common:
        return None
    p = paired([a[e] for e in common], [b[e] for e in common])
    return {**_ci(p.diff), "p_wilcoxon": p.p_wilcoxon, "p_sign": p.p_sign, "below": p.below,
            "above": p.above, "ties": p.ties, "episodes": common}  # fmt: skip


def settings(table: Table) -> list[dict]:
    rows = []
    for key in sorted(table.keys()):
        policy, mode, protect, f = key
        row = {"policy": policy, "mode": mode, "protect": protect, "fraction": f}
        for m in METRICS:
            row[m] = _ci(mean_ci(list(table.values(key, m).values())))
        retrieved = [r["probe_retrieved"] for rs in table.runs[key].values() for r in rs
                     if r.get("probe_retrieved") is not None]  # fmt: skip
        row["retrieval"] = sum(retrieved) / len(retrieved) if retrieved else None
        rows.append(row)
    return rows


def best_deterministic(table: Table, plan: StudyPlan, mode: str, fraction: float, episodes) -> str | None:
    """The deterministic policy with the lowest mean KL on `episodes` (only policies that ran on
    all of them compete, so every mean is over the same episodes)."""
    means = {}
    for p in plan.evicting:
        if p in RANDOM_DRAW:
            continue
        v = table.values((p, mode, PROTECT_MAIN, fraction))
        if episodes and set(episodes) <= set(v):
            means[p] = sum(v[e] for e in episodes) / len(episodes)
    return min(means, key=means.get) if means else None


def compare(table: Table, plan: StudyPlan, policy: str, modes) -> list[dict]:
    out = []
    for mode in modes:
        for f in plan.fractions:
            a = table.values((policy, mode, PROTECT_MAIN, f))
            best = best_deterministic(table, plan, mode, f, sorted(a))
            if best is None or not a:
                continue
            b = table.values((best, mode, PROTECT_MAIN, f))
            d = _paired(a, b)
            if d is None:
                continue
            ref = sum(b[e] for e in d["episodes"]) / len(d["episodes"])
            out.append({"policy": policy, "mode": mode, "fraction": f, "best": best, "best_kl": ref,
                        "policy_kl": ref + d["mean"], **d})  # fmt: skip
    return out


def protection(table: Table, plan: StudyPlan) -> list[dict]:
    """Each policy's KL with no protection minus with the sink, at the ablation budget."""
    out = []
    f = plan.ablation_fraction
    for p in plan.ablation_policies or plan.evicting:
        for mode in plan.modes:
            for other in ("none", "prompt"):
                d = _paired(table.values((p, mode, other, f)), table.values((p, mode, PROTECT_MAIN, f)))
                if d:
                    out.append({"policy": p, "mode": mode, "fraction": f, "contrast": f"{other} - sink", **d})
    return out


def by_position(table: Table, plan: StudyPlan, policy: str = "nexus", mode: str = "persistent") -> dict:
    """Margin = best deterministic KL - policy KL (positive: the policy is better) per position
    bucket, per budget, with CIs over episodes; and its trend with position over all of them."""
    rows, xs, ys = [], [], []
    for f in plan.fractions:
        best = best_deterministic(table, plan, mode, f, sorted(table.values((policy, mode, PROTECT_MAIN, f))))
        if best is None:
            continue
        mine, theirs = (
            table.buckets((policy, mode, PROTECT_MAIN, f)),
            table.buckets((best, mode, PROTECT_MAIN, f)),
        )
        per_bucket: dict[int, list[float]] = defaultdict(list)
        # Sorted: a bootstrap's CI depends on the order of its values, and set order changes with
        # each process's string hashing, so `--report-only` would not reproduce the printed CIs.
        for ep in sorted(set(mine) & set(theirs)):
            for b in sorted(set(mine[ep]) & set(theirs[ep])):
                m = theirs[ep][b] - mine[ep][b]
                per_bucket[b].append(m)
                xs.append(b)
                ys.append(m)
        for b in sorted(per_bucket):
            rows.append({"fraction": f, "best": best, "bucket": b, **_ci(mean_ci(per_bucket[b]))})
    return {"policy": policy, "mode": mode, "rows": rows, "trend": asdict(trend(xs, ys))}


# ----------------------------------------------------------------------- verdicts
def _fmt_diff(c: dict) -> str:
    return f"{c['mean']:+.4f} [{c['lo']:+.4f}, {c['hi']:+.4f}]"


def random_verdict(comps: list[dict], prot: list[dict]) -> tuple[str, str]:
    if not comps:
        return (
            "inconclusive",
            "no random-vs-deterministic comparison ran (random or a deterministic policy missing).",
        )
    tol = [EQUIV * max(c["best_kl"], 1e-12) for c in comps]
    equivalent = [_finite(c["hi"]) and c["hi"] <= t for c, t in zip(comps, tol, strict=True)]
    worse = [
        _finite(c["lo"]) and c["lo"] > t and c["p_wilcoxon"] < ALPHA for c, t in zip(comps, tol, strict=True)
    ]
    if min(c["n"] for c in comps) < MIN_EPISODES:
        verdict = "inconclusive"
    elif all(equivalent):
        verdict = "supported"
    elif sum(worse) > len(comps) / 2:
        verdict = "contradicted"
    else:
        verdict = "inconclusive"
    worst = max(comps, key=lambda c: c["mean"] / max(c["best_kl"], 1e-12))
    sink = [p for p in prot if p["policy"] == "random" and p["contrast"] == "none - sink"]
    prot_txt = ""
    if sink:
        s = sink[0]
        prot_txt = (f"; dropping the sink changes random's KL by {_fmt_diff(s)} ({s['mode']}, "
                    f"Wilcoxon p={s['p_wilcoxon']:.2f})")  # fmt: skip
    sentence = (
        f"random minus the best deterministic policy (KL, protect=sink) is within ±{EQUIV:.0%} of the best "
        f"in {sum(equivalent)}/{len(comps)} settings and significantly worse in {sum(worse)}/{len(comps)} "
        f"(CI and Wilcoxon p < {ALPHA}); "
        f"largest gap {worst['mode']} at {worst['fraction']:g}: {_fmt_diff(worst)} vs {worst['best']} "
        f"(KL {worst['best_kl']:.4f}, n={worst['n']}, Wilcoxon p={worst['p_wilcoxon']:.2f}){prot_txt}."
    )
    return verdict, sentence


def nexus_verdict(comps: list[dict], pos: dict) -> tuple[str, str]:
    pers = [c for c in comps if c["mode"] == "persistent"]
    if not pers:
        return "inconclusive", "no persistent nexus-vs-deterministic comparison ran."
    better = [_finite(c["hi"]) and c["hi"] < 0 and c["p_wilcoxon"] < ALPHA for c in pers]
    worse = [_finite(c["lo"]) and c["lo"] > 0 and c["p_wilcoxon"] < ALPHA for c in pers]
    t = pos["trend"]
    grows = _finite(t["slope"]) and t["slope"] > 0 and t["p_slope"] < ALPHA
    if min(c["n"] for c in pers) < MIN_EPISODES:
        verdict = "inconclusive"
    elif all(better) and grows:
        verdict = "supported"
    elif sum(worse) > len(pers) / 2:
        verdict = "contradicted"
    else:
        verdict = "inconclusive"
    parts = ", ".join(
        f"{c['fraction']:g}: {_fmt_diff(c)} vs {c['best']} (p={c['p_wilcoxon']:.2f})" for c in pers
    )
    slope = "n/a" if not _finite(t["slope"]) else f"{t['slope'] * 1000:+.4f} per 1k tokens"
    sentence = (
        f"persistent nexus minus the best deterministic policy (KL) by budget: {parts}; nexus is "
        f"significantly better in {sum(better)}/{len(pers)} and worse in {sum(worse)}/{len(pers)}; the margin's "
        f"slope with position is {slope} (p={t['p_slope']:.2f}, n={t['n']} episode-buckets)."
    )
    return verdict, sentence


def analyse(records: list[dict], plan: StudyPlan) -> dict:
    table = Table(records, plan)
    rand = compare(table, plan, "random", plan.modes) if "random" in plan.evicting else []
    nex = compare(table, plan, "nexus", plan.modes) if "nexus" in plan.evicting else []
    prot = protection(table, plan)
    pos = by_position(table, plan)
    rv, rs = random_verdict(rand, prot)
    nv, ns = nexus_verdict(nex, pos)
    eps = {}
    for r in records:
        if r.get("status") == "ok":
            eps.setdefault(
                r["episode"],
                {k: r.get(k) for k in ("episode", "tokens", "prompt_tokens", "turns", "n_scored")},
            )
    return {
        "plan": asdict(plan),
        "runs": sum(r.get("status") == "ok" for r in records),
        "episodes": sorted(eps.values(), key=lambda e: e["episode"]),
        "reference_logp": _ci(mean_ci([r["logp_true"] for r in table.full.values()])),
        "settings": settings(table),
        "random_attention": {"comparisons": rand, "protection": prot, "verdict": rv, "sentence": rs},
        "nexus": {"comparisons": nex, "by_position": pos, "verdict": nv, "sentence": ns},
    }
