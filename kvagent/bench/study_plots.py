"""The study's PNGs (matplotlib, Agg): KL by budget per policy, the claims' paired differences,
and the nexus margin by position. Each takes `analyse`'s dict and returns the written path."""

from __future__ import annotations

import math
from pathlib import Path

from kvagent.bench.plots import _save


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _err(c: dict) -> tuple[float, float]:
    if math.isnan(c["lo"]):
        return 0.0, 0.0
    return c["mean"] - c["lo"], c["hi"] - c["mean"]


def plot_kl(a: dict, path: Path) -> Path:
    plt = _plt()
    p = a["plan"]
    modes = p["modes"]
    fig, axes = plt.subplots(1, len(modes), figsize=(5.5 * len(modes), 4), squeeze=False)
    main = [s for s in a["settings"] if s["protect"] == "sink" and s["fraction"] in p["fractions"]]
    for ax, mode in zip(axes[0], modes, strict=True):
        for k, pol in enumerate(p["policies"]):
            pts = sorted((s["fraction"], s["kl"]) for s in main if s["policy"] == pol and s["mode"] == mode)
            if not pts:
                continue
            # Small offsets keep overlapping error bars apart.
            xs = [f * (1 + 0.015 * (k - len(p["policies"]) / 2)) for f, _ in pts]
            errs = list(zip(*[_err(c) for _, c in pts], strict=True))
            ax.errorbar(xs, [c["mean"] for _, c in pts], yerr=errs, marker="o", capsize=2, label=pol)
        ax.set_xlabel("budget (fraction of the episode)")
        ax.set_ylabel("KL(full‖policy), mean over episodes, 95% CI")
        ax.set_title(f"{mode}, protect=sink", fontsize=10)
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    out = _save(fig, path)
    plt.close(fig)
    return out


def plot_claims(a: dict, path: Path) -> Path:
    """Forest plot: policy minus the best deterministic policy (KL), per mode and budget."""
    plt = _plt()
    rows = [("random", c) for c in a["random_attention"]["comparisons"]]
    rows += [("nexus", c) for c in a["nexus"]["comparisons"]]
    fig, ax = plt.subplots(figsize=(7, 0.4 * max(4, len(rows)) + 1))
    for i, (name, c) in enumerate(rows):
        color = "tab:orange" if name == "random" else "tab:purple"
        ax.errorbar([c["mean"]], [i], xerr=[[v] for v in _err(c)], fmt="o", color=color, capsize=3)
    ax.set_yticks(range(len(rows)), [f"{n} − {c['best']} ({c['mode']}, K={c['fraction']:g})" for n, c in rows],
                  fontsize=8)  # fmt: skip
    ax.axvline(0, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel("KL difference (negative: the sampled policy is better), 95% CI over episodes")
    ax.invert_yaxis()
    ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    out = _save(fig, path)
    plt.close(fig)
    return out


def plot_position(a: dict, path: Path) -> Path:
    plt = _plt()
    pos = a["nexus"]["by_position"]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for f in sorted({r["fraction"] for r in pos["rows"]}):
        rs = [r for r in pos["rows"] if r["fraction"] == f]
        errs = list(zip(*[_err(r) for r in rs], strict=True))
        ax.errorbar([r["bucket"] for r in rs], [r["mean"] for r in rs], yerr=errs, marker="o", capsize=2,
                    label=f"K={f:g} vs {rs[0]['best']}")  # fmt: skip
    ax.axhline(0, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel(f"position of the scored token (bucket start, {a['plan']['bucket']} tokens)")
    ax.set_ylabel("KL(best det.) − KL(nexus), persistent")
    ax.grid(alpha=0.3)
    if pos["rows"]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    out = _save(fig, path)
    plt.close(fig)
    return out


def plot_study(a: dict, out_dir: str | Path) -> list[Path]:
    out = Path(out_dir)
    return [
        plot_kl(a, out / "study_kl.png"),
        plot_claims(a, out / "study_claims.png"),
        plot_position(a, out / "study_position.png"),
    ]
