"""From a design's records to its pre-registered tests (docs/study.md, "Design").

Unit: the episode (a seeded arm's runs are averaged within an episode first). Primary metric: the
episode's mean KL(full‖policy) over its scored tokens; a contrast is the per-episode log ratio
d = log(KL_subject / KL_baseline) (negative: the subject is closer to the full cache), so the margin
is a factor (log 1.25: within 25%) and episodes of different difficulty weigh alike. Every test is a
one-sample t-test on d (`study_stats.shift`), Holm-corrected over the design's primary family (the
named baselines x primary modes x budgets); the bootstrap CI, Wilcoxon and sign tests go along.
The verdicts (`study_verdicts`) read the Holm-adjusted p-values only."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from contextlib import suppress
from dataclasses import asdict

from kvagent.bench.study.design import Design, budget_for
from kvagent.bench.study.stats import holm, mean_ci, paired, shift
from kvagent.errors import ConfigError

METRICS = ("kl", "top1", "logp_true")
PRIMARY = "kl"


def _finite(x) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x))


def fraction_of(record: Mapping, fractions: Sequence[float]) -> list[float]:
    """The design's fractions whose K for this record's episode is the record's budget (several when
    an episode is short enough for two fractions to round to the same K)."""
    b = record.get("budget")
    if b is None:
        return []
    return [f for f in fractions if budget_for(f, int(record["tokens"])) == b]


class Table:
    """The records of one design by (arm, mode, fraction) and episode."""

    def __init__(self, records: Sequence[Mapping], design: Design):
        self.design = design
        self.full: dict[str, Mapping] = {}
        self.runs: dict[tuple, dict[str, list[Mapping]]] = defaultdict(lambda: defaultdict(list))
        for r in records:
            if r.get("status") != "ok":
                continue
            if r["policy"] == "full":
                self.full[r["episode"]] = r
                continue
            arm = design.arm_of(r)
            if arm is None:
                continue
            for f in fraction_of(r, design.fractions):
                self.runs[(arm.name, r["mode"], f)][r["episode"]].append(r)

    def values(self, key: tuple, metric: str = PRIMARY) -> dict[str, float]:
        out = {}
        for ep, rs in self.runs.get(key, {}).items():
            xs = [r[metric] for r in rs if _finite(r.get(metric))]
            if xs:
                out[ep] = sum(xs) / len(xs)
        return out

    def complete(self, key: tuple, episodes: Sequence[str]) -> bool:
        """Every episode has all of the arm's seeds for this setting."""
        arm = self.design.arm(key[0])
        want = set(self.design.seeds_of(arm))
        got = self.runs.get(key, {})
        return all({r["seed"] for r in got.get(e, [])} >= want for e in episodes)


def _ci(c) -> dict:
    return {"mean": c.mean, "lo": c.lo, "hi": c.hi, "n": c.n}


def contrast(table: Table, a: str, b: str, mode: str, fraction: float) -> dict | None:
    """Arm a against arm b on the episodes both ran: d = log(KL_a / KL_b) per episode."""
    va, vb = table.values((a, mode, fraction)), table.values((b, mode, fraction))
    common = sorted(set(va) & set(vb))
    usable = [e for e in common if va[e] > 0 and vb[e] > 0]
    if len(usable) < 1:
        return None
    la, lb = [math.log(va[e]) for e in usable], [math.log(vb[e]) for e in usable]
    d = [x - y for x, y in zip(la, lb, strict=True)]
    s = shift(d, table.design.margin)
    p = paired(la, lb)
    return {
        "arm": a, "baseline": b, "mode": mode, "fraction": fraction, "episodes": usable,
        "excluded": sorted(set(common) - set(usable)),  # a KL of exactly 0 has no log ratio
        "kl": sum(va[e] for e in usable) / len(usable), "baseline_kl": sum(vb[e] for e in usable) / len(usable),
        **asdict(s), "ratio": math.exp(s.mean), "boot": _ci(p.diff), "p_wilcoxon": p.p_wilcoxon,
        "p_sign": p.p_sign, "below": p.below, "above": p.above, "ties": p.ties,
    }  # fmt: skip


def _outcomes(rows: list[dict], test: str, alpha: float) -> None:
    """Holm over the family `rows`, then each row's outcome (in place)."""
    if not rows:
        return
    if test == "equivalence":
        for name, key in (("equivalent", "p_equivalent"), ("better", "p_below"), ("worse", "p_beyond_above")):
            for r, q in zip(rows, holm([r[key] for r in rows]), strict=True):
                r[f"holm_{name}"] = q
        for r in rows:
            r["outcome"] = ("equivalent" if r["holm_equivalent"] < alpha else "better" if r["holm_better"] < alpha
                            else "worse beyond the margin" if r["holm_worse"] < alpha else "undecided")  # fmt: skip
    else:
        for name, key in (("better", "p_below"), ("not_better", "p_within_below"), ("worse", "p_above")):
            for r, q in zip(rows, holm([r[key] for r in rows]), strict=True):
                r[f"holm_{name}"] = q
        for r in rows:
            r["outcome"] = ("better" if r["holm_better"] < alpha else "worse" if r["holm_worse"] < alpha
                            else "not better by the margin" if r["holm_not_better"] < alpha else "undecided")  # fmt: skip


def family(table: Table, pairs: Sequence[tuple[str, str]], modes: Sequence[str]) -> list[dict]:
    d = table.design
    rows = []
    for mode in modes:
        for f in d.fractions:
            for a, b in pairs:
                c = contrast(table, a, b, mode, f)
                if c:
                    rows.append(c)
    _outcomes(rows, d.test, d.alpha)
    return rows


# ----------------------------------------------------------------------- margin by position
def first_eviction(record: Mapping) -> int:
    """The first stream position whose prediction can have seen an evicted cache: once the smallest
    layer holds more than its trigger (persistent: K + 2r under recent-buffer, K + r under topk-all;
    one token late for a scheme that evicts at exactly the trigger), or the end of the first appended
    chunk that takes the history past K, if earlier (reprefill compresses there). Each layer's K and
    the trigger are the Schedule's of the record's own settings (PyramidKV's split depends on its
    window)."""
    from kvagent.runspec import RunSpec
    from kvagent.runtime.schedule import Schedule

    spec = RunSpec.from_record(record)
    n_layers = int(record.get("n_layers") or 1)
    k = int(record["budget"])
    schedule = Schedule(spec, None, n_layers)  # the trigger asks no policy
    with suppress(ConfigError):  # a policy (or option) that has left the registry: its uniform K
        schedule = Schedule.of(spec, n_layers)
        k = min(schedule.layer_budgets(0))
    at = schedule.trigger(k) + 1
    if record.get("mode") == "reprefill":
        ends = [e for e in record.get("append_ends") or [] if e > k]
        if ends:
            at = min(at, ends[0])
    return at


def _buckets(rs: Sequence[Mapping]) -> dict[int, tuple[int, float]]:
    """start -> (tokens, KL) over fine buckets wholly after every run's first eviction, seeds averaged."""
    start = max(first_eviction(r) for r in rs)
    acc: dict[int, list] = defaultdict(list)
    for r in rs:
        for b, n, kl, _a, _lp in r.get("positions") or []:
            if b >= start:
                acc[int(b)].append((int(n), kl))
    return {b: (v[0][0], sum(kl for _, kl in v) / len(v)) for b, v in acc.items()}


def _slope(points: Sequence[tuple[int, int, float]]) -> float | None:
    """Weighted least-squares slope (per 1k tokens) of margin on position, weights = tokens."""
    if len(points) < 3:
        return None
    w = [n for _, n, _ in points]
    sw = sum(w)
    mx = sum(wi * x for (x, _, _), wi in zip(points, w, strict=True)) / sw
    my = sum(wi * y for (_, _, y), wi in zip(points, w, strict=True)) / sw
    sxx = sum(wi * (x - mx) ** 2 for (x, _, _), wi in zip(points, w, strict=True))
    if sxx == 0:
        return None
    sxy = sum(wi * (x - mx) * (y - my) for (x, _, y), wi in zip(points, w, strict=True))
    return 1000 * sxy / sxx


def margin_trend(table: Table, baseline: str, mode: str = "persistent") -> dict:
    """Margin = KL(baseline) - KL(subject) per fine bucket from the first eviction on (positive: the
    subject is better); per episode the weighted slope of the margin on position, per budget and
    averaged over budgets; then across episodes a one-sided t-test (H1: mean slope > 0) and a
    Wilcoxon test. Also the margin per shown bucket, mean over episodes, for the table and plot."""
    d = table.design
    per_episode: dict[str, dict[float, float]] = defaultdict(dict)
    shown: dict[tuple[float, int], list[float]] = defaultdict(list)
    for f in d.fractions:
        mine, theirs = table.runs.get((d.subject, mode, f), {}), table.runs.get((baseline, mode, f), {})
        for ep in sorted(set(mine) & set(theirs)):
            a, b = _buckets(mine[ep]), _buckets(theirs[ep])
            pts = [(x, a[x][0], b[x][1] - a[x][1]) for x in sorted(set(a) & set(b))]
            s = _slope(pts)
            if s is not None:
                per_episode[ep][f] = s
            by: dict[int, list[tuple[int, float]]] = defaultdict(list)
            for x, n, m in pts:
                by[x // d.shown_bucket * d.shown_bucket].append((n, m))
            for x, v in by.items():
                shown[(f, x)].append(sum(n * m for n, m in v) / sum(n for n, _ in v))
    slopes = {ep: sum(v.values()) / len(v) for ep, v in per_episode.items() if len(v) == len(d.fractions)}
    eps = sorted(slopes)
    s = shift([slopes[e] for e in eps], 1.0)  # the margin argument is unused for these p-values
    w = paired([slopes[e] for e in eps], [0.0] * len(eps)) if eps else None
    rows = [{"fraction": f, "bucket": x, **_ci(mean_ci(v))} for (f, x), v in sorted(shown.items())]
    return {
        "baseline": baseline, "mode": mode, "episodes": eps, "slopes": {e: slopes[e] for e in eps},
        "per_fraction": {e: per_episode[e] for e in eps}, "mean": s.mean, "lo95": s.lo95, "hi95": s.hi95,
        "p_grows": s.p_above, "p_wilcoxon": w.p_wilcoxon if w else 1.0, "n": s.n, "rows": rows,
    }  # fmt: skip


# ----------------------------------------------------------------------- descriptive tables
def settings(table: Table) -> list[dict]:
    rows = []
    for key in sorted(
        table.runs, key=lambda k: ([a.name for a in table.design.arms].index(k[0]), k[1], k[2])
    ):
        arm, mode, f = key
        row = {"arm": arm, "mode": mode, "fraction": f}
        for m in METRICS:
            row[m] = _ci(mean_ci(list(table.values(key, m).values())))
        row["probe"] = probe_of([r for rs in table.runs[key].values() for r in rs])
        rows.append(row)
    return rows


def probe_of(records: Sequence[Mapping]) -> dict:
    """The planted-fact probe over runs: how many retrieved it, and the mean log p per value token."""
    got = [bool(r["probe_retrieved"]) for r in records if r.get("probe_retrieved") is not None]
    lps = [r["probe_logp"] for r in records if _finite(r.get("probe_logp"))]
    return {"runs": len(got), "retrieved": sum(got), "rate": sum(got) / len(got) if got else None,
            "logp": sum(lps) / len(lps) if lps else None}  # fmt: skip


def per_episode(table: Table, episodes: Sequence[str]) -> list[dict]:
    """Each episode's KL under every arm, per mode and budget (seeds averaged)."""
    d = table.design
    rows = []
    for mode in d.modes:
        for f in d.fractions:
            vals = {a.name: table.values((a.name, mode, f)) for a in d.arms}
            for ep in episodes:
                kl = {a: v[ep] for a, v in vals.items() if ep in v}
                if kl:
                    rows.append({"episode": ep, "mode": mode, "fraction": f, "kl": kl})
    return rows


def episodes_of(records: Sequence[Mapping], design: Design) -> list[dict]:
    eps: dict[str, dict] = {}
    for r in records:
        if r.get("status") == "ok":
            e = eps.setdefault(r["episode"], {k: r.get(k) for k in ("episode", "tokens", "prompt_tokens", "turns",
                                                                    "n_scored")})  # fmt: skip
            e["k"] = {f: budget_for(f, int(r["tokens"])) for f in design.fractions}
    return sorted(eps.values(), key=lambda e: e["episode"])
