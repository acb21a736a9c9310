"""The study's report from `study_verdicts.analyse`: `study.md` (verdict, design, power, episodes,
the pre-registered family, the other comparisons, the probe), `episodes.md` (the per-episode
tables) and `study.json` (every number in them)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from kvagent.fileio import atomic_write_json, atomic_write_text

SECTIONS = (
    "## Verdict",
    "## Design",
    "## Power",
    "## Episodes",
    "## Primary family",
    "## Other comparisons",
    "## Ablation",
    "## Planted-fact probe",
    "## Fidelity by arm",
)
POSITION = "## Margin by position"
MODES = "## Persistent vs reprefill"


def _f(x, spec: str = ".4f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _ci(c: Mapping | None, spec: str = ".4f") -> str:
    if not c or c.get("n", 0) == 0:
        return "-"
    if math.isnan(c["lo"]):
        return f"{_f(c['mean'], spec)} (n={c['n']})"
    return f"{_f(c['mean'], spec)} [{_f(c['lo'], spec)}, {_f(c['hi'], spec)}]"


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return [
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
        *["| " + " | ".join(r) + " |" for r in rows],
    ]


def _exp(x) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{math.exp(x):.3f}"


def _contrasts(rows: Sequence[Mapping], holm: bool) -> list[str]:
    head = ["arm", "baseline", "mode", "K", "n", "KL arm", "KL baseline", "ratio [95% CI]", "90% CI",
            "TOST p", "p below", "p above", *(["outcome (Holm)"] if holm else []), "Wilcoxon p", "lower/higher"]  # fmt: skip
    out = []
    for c in rows:
        out.append([
            c["arm"], c["baseline"], c["mode"], f"{c['fraction']:g}", str(c["n"]), _f(c["kl"]), _f(c["baseline_kl"]),
            f"{c['ratio']:.3f} [{_exp(c['lo95'])}, {_exp(c['hi95'])}]", f"[{_exp(c['lo90'])}, {_exp(c['hi90'])}]",
            _f(c["p_equivalent"], ".3g"), _f(c["p_below"], ".3g"), _f(c["p_above"], ".3g"),
            *([c["outcome"]] if holm else []), _f(c["p_wilcoxon"], ".3g"), f"{c['below']}/{c['above']}",
        ])  # fmt: skip
    return _table(head, out) if out else ["(none ran yet)"]


def _holm_table(rows: Sequence[Mapping]) -> list[str]:
    keys = sorted({k for c in rows for k in c if k.startswith("holm_")})
    body = [[c["baseline"], c["mode"], f"{c['fraction']:g}", *[_f(c[k], ".3g") for k in keys], c["outcome"]]
            for c in rows]  # fmt: skip
    return _table(["baseline", "mode", "K", *[k.replace("holm_", "Holm p ") for k in keys], "outcome"], body)


def _design(a: Mapping, command: str | None) -> list[str]:
    d = a["design"]
    arms = ", ".join(
        f"{x['name']} ({x['policy']}, protect={x['protect']}"
        + "".join(f", {k}={v}" for k, v in x["policy_args"].items())
        + (f", seeds {'/'.join(map(str, d['seeds']))}" if x["seeded"] else "")
        + (f", {'/'.join(x['modes'])} only" if x["modes"] else "")
        + (f", K={'/'.join(f'{f:g}' for f in x['fractions'])} only" if x["fractions"] else "")
        + ")"
        for x in d["arms"]
    )
    lines = [
        f"- claim tested: {d['statement']}",
        f"- arms: {arms}",
        f"- modes: {', '.join(d['modes'])} (primary: {', '.join(d['primary_modes'])}); budgets: "
        f"{', '.join(f'{f:g}' for f in d['fractions'])} of each episode's tokens, a fixed K per episode",
        f"- framework {a['framework']} (design: {d['framework']}), r={d['buffer']}, W={d['window']}",
        f"- episodes: prompt messages clipped to {d['clip_prompt_chars'] or 'no'} characters, later ones to "
        f"{d['clip_chars'] or 'no'} (head and tail), cut at whole turns at "
        f"{d['max_tokens']} tokens; eligible with >= {d['min_turns']} assistant turns, >= {d['min_tokens']} tokens"
        + (f", prompt <= {d['max_prompt_share']:g} x K" if d["max_prompt_share"] else "")
        + f"; the first {a['power']['needed']} eligible in file order",
        f"- primary family ({d['family_size']} tests, Holm at alpha={d['alpha']}): {d['subject']} vs "
        f"{', '.join(d['named'])}; test: {d['test']}; margin: a factor {d['margin_factor']:.2f} in KL",
        f"- runs in this report: {a['runs']}",
    ]
    if command:
        lines += ["", "Reproduce (resumes):", "", "```", command, "```"]
    return lines


def _power(a: Mapping) -> list[str]:
    p = a["power"]
    test = "TOST equivalence" if p["test"] == "equivalence" else "one-sided t-test"
    lines = [
        f"{test} on the per-episode log ratio, margin log {math.exp(p['margin']):.2f} = {p['margin']:.3f}, "
        f"assumed SD {p['assumed_sd']:.2f} (pilot), {p['family']} tests at alpha {p['per_test_alpha']:.4f} each "
        f"(Bonferroni, which Holm never exceeds): {p['needed']} episodes for power {p['target']:.0%}. This "
        f"report has {p['episodes']} (power {p['power_at_episodes']:.0%} at the assumed SD).",
    ]
    if p["reachable_margin_observed"] is not None and math.isfinite(p["reachable_margin_observed"]):
        lines.append(
            f"Observed: the median SD of the primary log ratios is {p['observed_sd']:.3f}; at it, "
            f"{p['episodes']} episodes resolve a factor {math.exp(p['reachable_margin_observed']):.3f} "
            f"with power {p['target']:.0%}."
        )
    return lines


def _episodes(a: Mapping) -> list[str]:
    fr = a["design"]["fractions"]
    rows = [[e["episode"], str(e["tokens"]), str(e["prompt_tokens"]), str(e["turns"]), str(e["n_scored"]),
             *[f"{e['k'][f]} ({e['prompt_tokens'] / e['k'][f]:.2f})" for f in fr]] for e in a["episodes"]]  # fmt: skip
    out = _table(
        ["episode", "tokens", "prompt", "turns", "scored", *[f"K={f:g} (prompt/K)" for f in fr]], rows
    )
    skipped = a.get("eligibility") or []
    if skipped:
        out += [
            "",
            f"Not chosen ({len(skipped)}): " + "; ".join(f"{e['name']}: {e['reason']}" for e in skipped),
        ]
    return out


def _probe(a: Mapping) -> list[str]:
    ref = a["reference"]["probe"]
    rows = [["full cache", "-", "-", f"{ref['retrieved']}/{ref['runs']}", _f(ref["logp"], ".3f")]]
    for s in a["settings"]:
        p = s["probe"]
        rows.append(
            [s["arm"], s["mode"], f"{s['fraction']:g}", f"{p['retrieved']}/{p['runs']}", _f(p["logp"], ".3f")]
        )
    return [
        "A fact planted once in the first observation, asked for after the episode: runs whose greedy answer "
        "holds it, and the mean log p per token of its value (teacher forced).",
        "",
        *_table(["arm", "mode", "K", "retrieved", "log p(value)"], rows),
    ]


def _settings(a: Mapping) -> list[str]:
    rows = [[s["arm"], s["mode"], f"{s['fraction']:g}", _ci(s["kl"]), _ci(s["top1"], ".3f"), _ci(s["logp_true"], ".3f")]
            for s in a["settings"]]  # fmt: skip
    return [
        f"Mean over episodes [95% bootstrap CI]. Full cache: mean log p(true) {_ci(a['reference']['logp'], '.3f')}.",
        "",
        *_table(["arm", "mode", "K", "KL(full‖arm)", "top-1 agreement", "log p(true)"], rows),
    ]


def _trends(a: Mapping) -> list[str]:
    out = [
        "Margin = KL(baseline) - KL(subject) per 32-token bucket of scored tokens from the first eviction on "
        "(positive: the subject is better); per episode the token-weighted slope on position (per 1k tokens), "
        "averaged over the budgets; across episodes a one-sided t-test (H1: slope > 0) and Wilcoxon.",
        "",
    ]
    rows = [[t["baseline"], str(t["n"]), f"{_f(t['mean'], '+.4f')} [{_f(t['lo95'], '+.4f')}, {_f(t['hi95'], '+.4f')}]",
             _f(t["p_grows"], ".3g"), _f(t["p_wilcoxon"], ".3g")] for t in a["trends"]]  # fmt: skip
    out += _table(["baseline", "episodes", "mean slope [95% CI]", "p (grows)", "Wilcoxon p"], rows)
    if a["trends"]:
        t = a["trends"][0]
        rows = [[f"{r['fraction']:g}", str(r["bucket"]), _ci(r, "+.4f")] for r in t["rows"]]
        out += ["", f"Margin over {t['baseline']} by position ({a['design']['shown_bucket']}-token buckets, mean over "
                "episodes [CI]):", "", *_table(["K", "bucket start", "margin [CI]"], rows)]  # fmt: skip
    return out


def _interaction(a: Mapping) -> list[str]:
    rows = [[c["baseline"], f"{c['fraction']:g}", str(c["n"]), f"{_f(c['mean'], '+.3f')} [{_f(c['lo95'], '+.3f')}, "
             f"{_f(c['hi95'], '+.3f')}]", _f(c["p_below"], ".3g")] for c in a["interaction"]]  # fmt: skip
    return [
        "d(persistent) - d(reprefill), d = log(KL subject / KL baseline) per episode (negative: the subject's "
        "edge is larger under persistent eviction); secondary, uncorrected.",
        "",
        *_table(["baseline", "K", "episodes", "difference [95% CI]", "p (below 0)"], rows),
    ]


def power_summary(design, chosen: Sequence, rows: Sequence) -> str:
    """What the CLI prints before anything runs: the power calculation and the episodes it picks."""
    plan = design.power_plan()
    eligible = [e for e in rows if e.reason is None]
    test = "TOST equivalence" if plan.test == "equivalence" else "one-sided t-test"
    lines = [
        f"study: {design.title} (--claim {design.claim}): {test} on log(KL {design.subject} / KL baseline), margin "
        f"x{math.exp(design.margin):.2f}, assumed SD {plan.sd:.2f}, {plan.family} tests (Holm; alpha "
        f"{plan.per_test_alpha:.4f} each for the count): {plan.needed} episodes for power {plan.target:.0%}",
        f"study: {len(eligible)} of {len(rows)} episodes eligible; running the first {len(chosen)} "
        f"(power {plan.power(len(chosen)):.0%} at the assumed SD)",
    ]
    lines += [f"study: not eligible: {e.name}: {e.reason}" for e in rows if e.reason]
    return "\n".join(lines)


def render(a: Mapping, command: str | None = None, plots: Sequence[str] = ()) -> str:
    d = a["design"]
    if a["interim"]:
        p = a["progress"]
        verdict = (
            f"**Interim report, no verdict yet: {p['episodes_done']} of {p['episodes_planned']} episodes "
            f"done** ({a['interim']})"
        )
    else:
        verdict = f"**Verdict: {a['verdict']}**"
    lines = [
        f"# Study: {d['title']} (`--claim {d['claim']}`)" + (" — interim" if a["interim"] else ""),
        "",
        SECTIONS[0],
        "",
        f"{verdict} — {a['sentence']}",
    ]
    lines += ["", SECTIONS[1], "", *_design(a, command), "", SECTIONS[2], "", *_power(a)]
    lines += ["", SECTIONS[3], "", *_episodes(a), "", SECTIONS[4], "", *_contrasts(a["primary"], True)]
    if a["primary"]:
        lines += ["", *_holm_table(a["primary"])]
    lines += [
        "",
        SECTIONS[5],
        "",
        "Uncorrected across this table (secondary).",
        "",
        *_contrasts(a["secondary"], False),
    ]
    lines += ["", SECTIONS[6], "", *_contrasts(a["ablation"], False)]
    if a["trends"]:
        lines += ["", POSITION, "", *_trends(a)]
    if a["interaction"]:
        lines += ["", MODES, "", *_interaction(a)]
    lines += ["", SECTIONS[7], "", *_probe(a), "", SECTIONS[8], "", *_settings(a)]
    if plots:
        lines += ["", *[f"![{Path(p).stem}]({p})" for p in plots]]
    lines += [
        "",
        "Per-episode values: [episodes.md](episodes.md); every number: study.json; raw runs: fidelity.json.",
        "",
    ]
    return "\n".join(lines)


def render_episodes(a: Mapping) -> str:
    d = a["design"]
    arms = [x["name"] for x in d["arms"]]
    lines = [f"# {d['title']}: per-episode KL(full‖arm) (seeds averaged)", ""]
    for mode in d["modes"]:
        for f in d["fractions"]:
            rows = [r for r in a["per_episode"] if r["mode"] == mode and r["fraction"] == f]
            if not rows:
                continue
            shown = [x for x in arms if any(x in r["kl"] for r in rows)]
            lines += [f"## {mode}, K={f:g}", ""]
            lines += _table(
                ["episode", *shown], [[r["episode"], *[_f(r["kl"].get(x)) for x in shown]] for r in rows]
            )
            lines.append("")
    for t in a["trends"]:
        lines += [f"## Slope of the margin over {t['baseline']} (KL per 1k tokens, persistent)", ""]
        fr = d["fractions"]
        body = [[e, *[_f(t["per_fraction"][e].get(f), "+.4f") for f in fr], _f(t["slopes"][e], "+.4f")]
                for e in t["episodes"]]  # fmt: skip
        lines += _table(["episode", *[f"K={f:g}" for f in fr], "mean"], body) + [""]
    return "\n".join(lines)


def write_report(
    a: Mapping, out_dir: str | Path, command: str | None = None, plots: Sequence[str] = ()
) -> Path:
    out = Path(out_dir)
    atomic_write_json(out / "study.json", a)
    atomic_write_text(out / "episodes.md", render_episodes(a))
    return atomic_write_text(out / "study.md", render(a, command, plots))
