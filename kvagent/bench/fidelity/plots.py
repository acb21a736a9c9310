"""The fidelity plot (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path

from kvagent.bench.fidelity.tables import fidelity_rows
from kvagent.bench.plots import _save

METRICS = (
    ("kl", "mean KL(full‖policy)"),
    ("top1", "top-1 agreement"),
    ("retrieval", "planted fact retrieved"),
    ("probe_logp", "log p(planted fact)"),
)
MODES = ("persistent", "reprefill")


def plot_fidelity(records: list[dict], path: str | Path) -> Path:
    """Rows: metrics; columns: persistent and reprefill; one line per policy (and scope/protect
    variant), x = budget. The full cache is the dashed reference."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = fidelity_rows(records)
    full = next((r for r in rows if r["policy"] == "full"), None)
    variants = sorted({(r["scope"], r["protect"]) for r in rows if r["policy"] != "full"})
    fig, axes = plt.subplots(len(METRICS), len(MODES), figsize=(10, 3.0 * len(METRICS)), squeeze=False)
    for ci, mode in enumerate(MODES):
        for ri, (metric, title) in enumerate(METRICS):
            ax = axes[ri][ci]
            lines = {}
            for r in rows:
                # dense rows (the full cache, also under observation masking) have no budget: table only
                if r["budget"] is None or r["mode"] != mode or r[metric] is None:
                    continue
                label = r["policy"] if len(variants) <= 1 else f"{r['policy']} ({r['scope']}, {r['protect']})"
                lines.setdefault(label, []).append((r["budget"], r[metric]))
            budgets = sorted({p[0] for pts in lines.values() for p in pts})
            if len(budgets) == 1:
                # One budget: a line plot would be isolated dots; compare the policies as bars.
                labels = sorted(lines)
                ax.bar(range(len(labels)), [lines[k][0][1] for k in labels], color="tab:blue")
                ax.set_xticks(range(len(labels)), labels, fontsize=8)
                ax.set_xlabel(f"policy at K={budgets[0]}")
            else:
                for label, pts in sorted(lines.items()):
                    pts.sort(key=lambda p: p[0])
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
                ax.set_xlabel("budget K (entries per head)")
            if full is not None and full[metric] is not None:
                ax.axhline(full[metric], color="grey", linestyle="--", linewidth=1, label="full")
            ax.set_title(f"{title} — {mode}", fontsize=9)
            ax.grid(alpha=0.3)
            if lines and len(budgets) > 1 or full is not None:
                ax.legend(fontsize=7)
    fig.tight_layout()
    out = _save(fig, Path(path))
    plt.close(fig)
    return out
