"""The study's PNGs (matplotlib, Agg), from `study_verdicts.analyse`: the contrasts as a forest plot
of KL ratios with the margin shaded, KL per arm, and (nexus) the margin by position."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

from kvagent.bench.plots import _save


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_contrasts(a: Mapping, path: Path) -> Path:
    """Each contrast's geometric-mean KL ratio with its 95% t interval; the margin band shaded."""
    plt = _plt()
    rows = [("primary", c) for c in a["primary"]] + [("other", c) for c in a["secondary"]]
    rows += [("ablation", c) for c in a["ablation"]]
    fig, ax = plt.subplots(figsize=(7.5, 0.32 * max(6, len(rows)) + 1.2))
    m = a["design"]["margin_factor"]
    ax.axvspan(1 / m, m, color="tab:green", alpha=0.12, label=f"margin ×{m:.2f}")
    colors = {"primary": "tab:blue", "other": "tab:grey", "ablation": "tab:orange"}
    for i, (kind, c) in enumerate(rows):
        lo = math.exp(c["lo95"]) if c["n"] > 1 else c["ratio"]
        hi = math.exp(c["hi95"]) if c["n"] > 1 else c["ratio"]
        ax.errorbar([c["ratio"]], [i], xerr=[[c["ratio"] - lo], [hi - c["ratio"]]], fmt="o", capsize=3,
                    color=colors[kind])  # fmt: skip
    labels = [f"{c['arm']} / {c['baseline']} ({c['mode'][:4]}, K={c['fraction']:g})" for _, c in rows]
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.axvline(1, color="grey", linestyle="--", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlabel(
        "KL ratio, geometric mean over episodes, 95% CI (below 1: the arm is closer to the full cache)"
    )
    ax.invert_yaxis()
    ax.grid(alpha=0.3, axis="x")
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(f"{a['design']['title']}: blue = pre-registered family, orange = ablation", fontsize=9)
    fig.tight_layout()
    out = _save(fig, path)
    plt.close(fig)
    return out


def plot_kl(a: Mapping, path: Path) -> Path:
    plt = _plt()
    d = a["design"]
    cols = [(m, f) for m in d["modes"] for f in d["fractions"]]
    fig, axes = plt.subplots(1, len(cols), figsize=(4.2 * len(cols), 3.8), squeeze=False)
    for ax, (mode, f) in zip(axes[0], cols, strict=True):
        ss = [s for s in a["settings"] if s["mode"] == mode and s["fraction"] == f and s["kl"]["n"]]
        for i, s in enumerate(ss):
            c = s["kl"]
            err = [[0.0], [0.0]] if math.isnan(c["lo"]) else [[c["mean"] - c["lo"]], [c["hi"] - c["mean"]]]
            color = "tab:blue" if s["arm"] == d["subject"] else "tab:grey"
            ax.errorbar([c["mean"]], [i], xerr=err, fmt="o", capsize=2, color=color)
        ax.set_yticks(range(len(ss)), [s["arm"] for s in ss], fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("KL(full‖arm), mean over episodes, 95% CI", fontsize=8)
        ax.set_title(f"{mode}, K={f:g}", fontsize=9)
        ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    out = _save(fig, path)
    plt.close(fig)
    return out


def plot_position(a: Mapping, path: Path) -> Path:
    """Left: the margin over the trend baseline by position, per budget. Right: each episode's slope."""
    plt = _plt()
    t = a["trends"][0]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    for f in sorted({r["fraction"] for r in t["rows"]}):
        rs = [r for r in t["rows"] if r["fraction"] == f]
        err = [[0 if math.isnan(r["lo"]) else r["mean"] - r["lo"] for r in rs],
               [0 if math.isnan(r["hi"]) else r["hi"] - r["mean"] for r in rs]]  # fmt: skip
        ax.errorbar(
            [r["bucket"] for r in rs],
            [r["mean"] for r in rs],
            yerr=err,
            marker="o",
            capsize=2,
            label=f"K={f:g}",
        )
    ax.axhline(0, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel(
        f"position of the scored tokens ({a['design']['shown_bucket']}-token buckets, after the first eviction)"
    )
    ax.set_ylabel(f"KL({t['baseline']}) − KL({a['design']['subject']}), persistent")
    ax.grid(alpha=0.3)
    if t["rows"]:
        ax.legend(fontsize=8)
    slopes = [t["slopes"][e] for e in t["episodes"]]
    bx.scatter(range(len(slopes)), sorted(slopes), s=14)
    bx.axhline(0, color="grey", linestyle="--", linewidth=1)
    bx.set_xlabel("episode (sorted by slope)")
    bx.set_ylabel("slope of the margin, KL per 1k tokens")
    bx.set_title(f"mean {t['mean']:+.4f}, one-sided p={t['p_grows']:.3g}, n={t['n']}", fontsize=9)
    bx.grid(alpha=0.3)
    fig.tight_layout()
    out = _save(fig, path)
    plt.close(fig)
    return out


def plot_study(a: Mapping, out_dir: str | Path) -> list[Path]:
    out = Path(out_dir)
    paths = [plot_contrasts(a, out / "study_contrasts.png"), plot_kl(a, out / "study_kl.png")]
    if a["trends"]:
        paths.append(plot_position(a, out / "study_position.png"))
    return paths
