"""The demo's picture (one PNG): the KV memory each run held over the episode's tokens, its
fidelity turn by turn, and, where the full cache retrieves the planted fact, which runs lose it."""

from __future__ import annotations

from pathlib import Path

from kvagent.bench.demo.series import memory_band
from kvagent.bench.plots import _save

COLORS = {"full": "black", "random": "tab:blue", "snapkv": "tab:orange", "nexus": "tab:green"}
STYLES = {"persistent": "-", "reprefill": "--"}


def _label(r: dict) -> str:
    return "full (dense)" if r["policy"] == "full" else f"{r['policy']} {r['mode']}"


def _style(r: dict, fallback: list[str]) -> dict:
    color = COLORS.get(r["policy"]) or fallback[hash(r["policy"]) % len(fallback)]
    return {"color": color, "linestyle": "-" if r["policy"] == "full" else STYLES.get(r["mode"], ":")}


def band_text(k: int, r: int, n: int) -> str:
    """A band edge as the reader knows it: K, K+r, K+2r, or the plain number."""
    return {k: f"K={n}", k + r: f"K+r={n}", k + 2 * r: f"K+2r={n}"}.get(n, str(n))


def probe_shown(records: list[dict]) -> bool:
    """The probe says something only where the full cache retrieves the fact."""
    full = next((r for r in records if r["policy"] == "full"), None)
    return bool(full and full.get("probe_retrieved"))


def plot_demo(records: list[dict], path: str | Path, title: str) -> Path:
    """`records`: one episode's runs (fidelity records with `demo.series.series` fields)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in records if r.get("memory")]
    full = next((r for r in runs if r["policy"] == "full"), None)
    evicting = [r for r in runs if r["policy"] != "full"]
    probe = probe_shown(runs)
    fallback = [c for c in plt.rcParams["axes.prop_cycle"].by_key()["color"] if c not in COLORS.values()]
    fig = plt.figure(figsize=(12, 6.5) if probe else (9, 6.5))
    grid = fig.add_gridspec(
        2, 2 if probe else 1, width_ratios=[2.6, 1] if probe else None, hspace=0.08, wspace=0.35
    )
    mem = fig.add_subplot(grid[0, 0])
    fid = fig.add_subplot(grid[1, 0], sharex=mem)
    fact_at = next((r.get("fact_at") for r in runs if r.get("fact_at") is not None), None)
    for r in ([full] if full else []) + evicting:
        xs, ys = zip(*r["memory"], strict=True)
        mem.step(xs, ys, where="post", label=_label(r), linewidth=1.4, **_style(r, fallback))
        if r["policy"] != "full":
            fid.plot(
                r["turn_end"], r["turn_kl"], marker="o", markersize=3, label=_label(r), **_style(r, fallback)
            )
    bands = sorted({(r["budget"], r["buffer"], *memory_band(r)) for r in evicting if memory_band(r)})
    for k, buf, lo, hi in bands:
        mem.axhspan(lo, hi, color="grey", alpha=0.15, linewidth=0)
        mem.annotate(f"{band_text(k, buf, lo)} .. {band_text(k, buf, hi)}", (1, hi), xytext=(-4, 3),
                     xycoords=("axes fraction", "data"), textcoords="offset points", ha="right", fontsize=8,
                     color="dimgrey")  # fmt: skip
    for ax in (mem, fid):
        if fact_at is not None:
            ax.axvline(fact_at, color="purple", linewidth=0.8, linestyle=":")
        ax.grid(alpha=0.3)
    if fact_at is not None:
        mem.annotate("fact planted", (fact_at, mem.get_ylim()[1]), xytext=(3, -12), textcoords="offset points",
                     fontsize=8, color="purple")  # fmt: skip
    mem.set_ylabel("KV entries held\n(fullest layer)")
    where = "its band"
    if len(bands) == 1:
        k, buf, lo, hi = bands[0]
        where = f"{band_text(k, buf, lo)}..{band_text(k, buf, hi)}"
    mem.set_title(f"KV memory between forwards: the dense cache grows, every evicting run stays in {where}\n"
                  "(reprefill's per-turn rebuild holds the whole history for that prefill)", fontsize=10)  # fmt: skip
    mem.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0.0, 0.93))
    plt.setp(mem.get_xticklabels(), visible=False)
    fid.set_ylabel("mean KL(full‖run)\nper assistant turn")
    fid.set_xlabel("episode tokens fed")
    fid.set_title("Fidelity turn by turn (0 = the full cache's distribution)", fontsize=10, y=0.88)
    fid.set_ylim(bottom=0)
    if probe:
        ax = fig.add_subplot(grid[:, 1])
        rows = ([full] if full else []) + evicting
        vals = [r["probe_logp"] for r in rows]
        colors = ["tab:green" if r.get("probe_retrieved") else "tab:red" for r in rows]
        ax.barh(range(len(rows)), vals, color=colors)
        ax.set_yticks(range(len(rows)), [_label(r) for r in rows], fontsize=8)
        ax.invert_yaxis()
        for i, r in enumerate(rows):
            ax.annotate("retrieved" if r.get("probe_retrieved") else "lost", (vals[i], i), xytext=(-3, 0),
                        textcoords="offset points", ha="right", va="center", fontsize=8)  # fmt: skip
        ax.set_xlim(min(vals) * 1.45, 0)
        ax.set_xlabel("log p(fact's tokens), teacher forced")
        ax.set_title("Planted fact asked at the end", fontsize=10)
        ax.grid(alpha=0.3, axis="x")
    fig.suptitle(title, fontsize=11)
    out = _save(fig, Path(path))
    plt.close(fig)
    return out
