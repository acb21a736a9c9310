"""The study's report: `study.md` (grid, tables, verdicts, the command that made them) and
`study.json` (every number in it), from `kvagent.bench.study_analysis.analyse`."""

from __future__ import annotations

import math
from pathlib import Path

from kvagent.bench.study_analysis import EQUIV, MIN_EPISODES
from kvagent.fileio import atomic_write_json, atomic_write_text

SECTIONS = (
    "## Grid",
    "## Episodes",
    "## Fidelity by policy and budget",
    "## Claim 1: Random Attention",
    "## Claim 2: Nexus Sampling",
    "## Protection ablation",
    "## Margin vs context length",
    "## Method",
)


def _f(x, spec: str = ".4f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _ci(c: dict, spec: str = ".4f") -> str:
    if c is None or c.get("n", 0) == 0:
        return "-"
    if math.isnan(c["lo"]):
        return f"{_f(c['mean'], spec)} (n={c['n']})"
    return f"{_f(c['mean'], spec)} [{_f(c['lo'], spec)}, {_f(c['hi'], spec)}]"


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
        *["| " + " | ".join(r) + " |" for r in rows],
    ]


def _grid(a: dict, command: str | None) -> list[str]:
    p = a["plan"]
    lines = [
        f"- policies: {', '.join(p['policies'])} (random draws: seeds {', '.join(map(str, p['seeds']))}; "
        "deterministic policies run once)",
        f"- modes: {', '.join(p['modes'])}",
        f"- budgets: {', '.join(f'{f:g}' for f in p['fractions'])} of each episode's tokens, a fixed K per "
        "episode (rounded to the common block), protect=sink",
        f"- protection ablation: {', '.join(p['ablation_protects'])} at {p['ablation_fraction']:g} "
        "(prompt only where the protected prompt fits in K)",
        f"- buffer r={p['buffer']}, window W={p['window']}, position buckets of {p['bucket']} tokens",
        f"- runs in this report: {a['runs']} (a study cut short reports the settings it finished: "
        "they run setting by setting, each over every episode)",
    ]
    if command:
        lines += ["", "Reproduce:", "", "```", command, "```"]
    return lines


def _episodes(a: dict) -> list[str]:
    rows = [[e["episode"], str(e["tokens"]), str(e["prompt_tokens"]), str(e["turns"]), str(e["n_scored"])]
            for e in a["episodes"]]  # fmt: skip
    return _table(["episode", "tokens", "prompt", "turns", "scored tokens"], rows)


def _fidelity(a: dict) -> list[str]:
    p = a["plan"]
    out = [f"Mean over episodes [95% bootstrap CI]; protect=sink. Full cache: mean log p(true) "
           f"{_ci(a['reference_logp'], '.3f')}.", ""]  # fmt: skip
    main = [s for s in a["settings"] if s["protect"] == "sink" and s["fraction"] in p["fractions"]]
    for metric, title, spec in (("kl", "KL(full‖policy)", ".4f"), ("top1", "top-1 agreement", ".3f")):
        for mode in p["modes"]:
            rows = []
            for pol in p["policies"]:
                cells = {s["fraction"]: s for s in main if s["policy"] == pol and s["mode"] == mode}
                if cells:
                    rows.append(
                        [pol, *[_ci(cells[f][metric], spec) if f in cells else "-" for f in p["fractions"]]]
                    )
            out += [
                f"**{title}, {mode}**",
                "",
                *_table(["policy", *[f"K={f:g}" for f in p["fractions"]]], rows),
                "",
            ]
    return out


def _comparisons(comps: list[dict]) -> list[str]:
    rows = [
        [
            c["mode"],
            f"{c['fraction']:g}",
            c["best"],
            _f(c["best_kl"]),
            _f(c["policy_kl"]),
            _ci(c, "+.4f"),
            _f(c["p_wilcoxon"], ".3f"),
            _f(c["p_sign"], ".3f"),
            f"{c['below']}/{c['above']}/{c['ties']}",
        ]  # fmt: skip
        for c in comps
    ]
    head = ["mode", "K", "best deterministic", "its KL", "policy KL", "difference [CI]",
            "Wilcoxon p", "sign p", "lower/higher/tie"]  # fmt: skip
    return _table(head, rows)


def _claim(name: str, claim: str, block: dict, settle: str) -> list[str]:
    return [
        f"Claim: {claim}",
        "",
        *_comparisons(block["comparisons"]),
        "",
        f"**Verdict: {block['verdict']}** — {block['sentence']}",
        "",
        f"What would settle it: {settle}",
    ]


def _protection(a: dict) -> list[str]:
    rows = [
        [c["policy"], c["mode"], c["contrast"], _ci(c, "+.4f"), _f(c["p_wilcoxon"], ".3f"), _f(c["p_sign"], ".3f"), str(c["n"])]
        for c in a["random_attention"]["protection"]
    ]  # fmt: skip
    f = a["plan"]["ablation_fraction"]
    return [
        f"KL with the other protection minus KL with protect=sink, at K={f:g} (positive: sink is better).",
        "",
        *_table(["policy", "mode", "contrast", "difference [CI]", "Wilcoxon p", "sign p", "episodes"], rows),
    ]


def _position(a: dict) -> list[str]:
    pos = a["nexus"]["by_position"]
    rows = [[f"{r['fraction']:g}", r["best"], str(r["bucket"]), _ci(r, "+.4f")] for r in pos["rows"]]
    t = pos["trend"]
    return [
        f"Margin = KL(best deterministic) - KL({pos['policy']}), {pos['mode']}, per {a['plan']['bucket']}-token "
        "position bucket of the scored tokens (positive: nexus better), mean over episodes [CI].",
        "",
        *_table(["K", "best deterministic", "bucket start", "margin [CI]"], rows),
        "",
        f"Trend of the margin with position (all budgets pooled): slope {_f(t['slope'] * 1000 if t['slope'] == t['slope'] else None, '+.5f')} "
        f"per 1k tokens (linregress p={_f(t['p_slope'], '.3f')}), Spearman rho {_f(t['rho'], '+.2f')} "
        f"(p={_f(t['p_rho'], '.3f')}), n={t['n']}.",
    ]


METHOD = f"""Teacher-forced replay (`kvagent bench fidelity`): each episode's token stream is fed to the
model under each setting and, at every assistant token, compared with the full-cache run: KL(full‖policy)
on the reference's top-256 tokens plus a tail bucket, top-1 agreement and log p of the real token.
Seeds of random-draw policies are averaged within an episode; the episode is the unit of every
statistic. Means carry 95% percentile-bootstrap CIs over episodes (`scipy.stats.bootstrap`, 4000
resamples). Paired comparisons use the same episodes under both settings: the bootstrap CI of the
per-episode difference, the Wilcoxon signed-rank test (`scipy.stats.wilcoxon`) and the sign test
(`scipy.stats.binomtest`). "About as good" means within {EQUIV:.0%} of the best deterministic policy's
KL. The margin's trend is `scipy.stats.linregress` and `spearmanr` over (bucket, margin) points. With
n episodes the smallest two-sided Wilcoxon p is 2/2^n (0.0625 at n=5), so below {MIN_EPISODES} episodes every verdict
is "inconclusive" whatever the CIs say."""


def render(a: dict, command: str | None = None, plots: list[str] | None = None) -> str:
    ra, nx = a["random_attention"], a["nexus"]
    lines = ["# Study: eviction policies on real agent trajectories", "", SECTIONS[0], "", *_grid(a, command)]
    lines += ["", SECTIONS[1], "", *_episodes(a), "", SECTIONS[2], "", *_fidelity(a)]
    lines += [SECTIONS[3], "", *_claim("random", "once the sink is protected, uniform random eviction is about "
              "as good as the best deterministic top-K.", ra,
              "more episodes (the CI shrinks as 1/sqrt(n)), a larger model whose attention is less diffuse, "
              "and end-task success (SWE-bench Resolved) rather than KL.")]  # fmt: skip
    lines += ["", SECTIONS[4], "", *_claim("nexus", "under persistent eviction, reservoir sampling over a walk "
              "score beats deterministic top-K, by more as the context grows.", nx,
              "longer episodes (8k-32k tokens, a GPU), more episodes, and SWE-bench Resolved under "
              "persistent eviction.")]  # fmt: skip
    lines += ["", SECTIONS[5], "", *_protection(a), "", SECTIONS[6], "", *_position(a)]
    if plots:
        lines += ["", *[f"![{Path(p).stem}]({p})" for p in plots]]
    lines += ["", SECTIONS[7], "", METHOD, ""]
    return "\n".join(lines)


def write_report(
    a: dict, out_dir: str | Path, command: str | None = None, plots: list[str] | None = None
) -> Path:
    out = Path(out_dir)
    atomic_write_json(out / "study.json", a)
    return atomic_write_text(out / "study.md", render(a, command, plots))
