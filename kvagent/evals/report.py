"""`kvagent report`: Markdown table, JSON and PNG plot from a run directory's `runs.jsonl`."""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

from kvagent.errors import KvagentError
from kvagent.evals.stats import _budget_key, is_infra_error, load_runs, settle, summarize
from kvagent.fileio import atomic_write_bytes, atomic_write_json, atomic_write_text


def budget_cell(budget: Any) -> str:
    return "-" if budget is None else str(budget)


def _pct(x: float | None) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}"


def _num(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def _p(p: float) -> str:
    return f"{p:.3g}" if p >= 0.001 else f"{p:.1e}"


def _policy(row: dict[str, Any]) -> str:
    return f"{row['policy']} ({row['variant']})" if row.get("variant") else row["policy"]


def _ref(c: dict[str, Any]) -> str:
    return "" if c["b_budget"] == c["budget"] else f" ({budget_cell(c['b_budget'])})"


def render_markdown(summary: dict[str, Any]) -> str:
    boot = summary["bootstrap"]
    level = int(round(100 * boot["level"]))
    lines = [
        "# kvagent evaluation report",
        "",
        f"{summary['n_runs']} runs over {len(summary['instances'])} instances. Pass@1 = mean over seeds of "
        f"`resolved`, averaged over instances; {level}% CIs from a paired bootstrap over instances "
        f"({boot['n_boot']} replicates, seed {boot['seed']}).",
        "",
    ]
    if summary.get("n_errors"):
        lines += [
            f"**{summary['n_errors']} runs hit infrastructure errors** (column `errors`): they are not "
            "counted in any Pass@1 and are redone when the same `kvagent eval` runs again.",
            "",
        ]
    lines += _environment_lines(summary)
    lines += [
        "Evicting runs use the papers' framework (recent-buffer: the newest r entries are never "
        "scored) unless the policy says topk-all.",
        "",
        "| policy | mode | budget | instances | seeds | Resolved | Pass@1 % | "
        f"{level}% CI | Pass@k % | errors | steps | tokens | evictions | KV MiB |",
        "|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in summary["configs"]:
        lo, hi = r["pass_at_1_ci"]
        kv = r["mean_kv_bytes"]
        lines.append(
            f"| {_policy(r)} | {r['mode']} | {budget_cell(r['budget'])} | {r['n_instances']} | "
            f"{len(r['seeds'])} | {r['resolved']:.2f} | {_pct(r['pass_at_1'])} | [{_pct(lo)}, {_pct(hi)}] | "
            f"{_pct(r['pass_at_k'])} | {r.get('n_errors', 0)} | {_num(r['mean_steps'])} | {_num(r['mean_tokens'], 0)} | "
            f"{_num(r['mean_evictions'])} | {_num(None if kv is None else kv / 2**20)} |"
        )
    if summary["comparisons"]:
        lines += [
            "",
            "## Policy differences (A - B, paired by instance)",
            "",
            f"| mode | budget | A | B (budget) | pairs | Δ Pass@1 pp | {level}% CI | A better | B better | sign test p |",
            "|---|---:|---|---|---:|---:|---|---:|---:|---:|",
        ]
        for c in summary["comparisons"]:
            lo, hi = c["diff_ci"]
            lines.append(
                f"| {c['mode']} | {budget_cell(c['budget'])} | {c['a']} | {c['b']}{_ref(c)} | {c['n_paired']} | "
                f"{_pct(c['diff'])} | [{_pct(lo)}, {_pct(hi)}] | {c['a_better']} | {c['b_better']} | "
                f"{_p(c['sign_test_p'])} |"
            )
    return "\n".join(lines) + "\n"


def environment_facts(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """What the images got wrong, from the latest record of each run: `env_errors` (instance ->
    why the tests could not run) and `environment_differs` (instance -> `environment differs: ...`)."""
    key = ("instance_id", "policy", "mode", "budget", "seed")
    latest = settle(runs, lambda r: r.get("run_id") or tuple(str(r.get(k)) for k in key))
    errors = {
        r["instance_id"]: r["env_error"] for r in latest.values() if is_infra_error(r) and r.get("env_error")
    }
    differs = {r["instance_id"]: r["environment"] for r in latest.values() if r.get("environment")}
    return {"env_errors": dict(sorted(errors.items())), "environment_differs": dict(sorted(differs.items()))}


def _environment_lines(summary: dict[str, Any]) -> list[str]:
    lines = []
    errors = summary.get("env_errors") or {}
    if errors:
        lines += [
            f"**Environment errors on {len(errors)} instances** (among the errors above): the image could "
            "not run the tests, with the gold patch either, so no policy is charged for them: "
            + "; ".join(f"{iid}: {why}" for iid, why in errors.items()),
            "",
        ]
    differs = summary.get("environment_differs") or {}
    if differs:
        lines += [
            f"{len(differs)} instances ran in an image other than swebench's spec names: "
            + "; ".join(f"{iid}: {note}" for iid, note in differs.items()),
            "",
        ]
    return lines


def render_plot(summary: dict[str, Any]) -> bytes:
    """PNG: Pass@1 (with CI bars) vs budget, one line per policy, one panel per mode. Configurations
    without a numeric budget (e.g. `full`) are drawn as horizontal reference lines."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers; must precede pyplot
    import matplotlib.pyplot as plt

    rows = summary["configs"]
    modes = sorted({r["mode"] for r in rows}) or ["-"]
    fig, axes = plt.subplots(1, len(modes), figsize=(5.5 * len(modes), 4.2), squeeze=False, sharey=True)
    policies = sorted({r["policy"] for r in rows})
    colors = {p: f"C{i % 10}" for i, p in enumerate(policies)}
    for ax, mode in zip(axes[0], modes, strict=True):
        mine = [r for r in rows if r["mode"] == mode]
        for policy in policies:
            pts = sorted((r for r in mine if r["policy"] == policy), key=lambda r: _budget_key(r["budget"]))
            numeric = [r for r in pts if _budget_key(r["budget"])[0] == 0]
            if numeric:
                x = [float(r["budget"]) for r in numeric]
                y = [100 * r["pass_at_1"] for r in numeric]
                lo = [max(0.0, y_ - 100 * r["pass_at_1_ci"][0]) for y_, r in zip(y, numeric, strict=True)]
                hi = [max(0.0, 100 * r["pass_at_1_ci"][1] - y_) for y_, r in zip(y, numeric, strict=True)]
                ax.errorbar(x, y, yerr=[lo, hi], marker="o", capsize=3, label=policy, color=colors[policy])
            for r in pts:
                if _budget_key(r["budget"])[0] == 1:
                    ax.axhline(
                        100 * r["pass_at_1"],
                        linestyle="--",
                        color=colors[policy],
                        label=policy if r["budget"] is None else f"{policy} ({r['budget']})",
                    )
        ax.set_title(f"mode: {mode}")
        ax.set_xlabel("KV budget (tokens)")
        ax.grid(alpha=0.3)
        if any(_budget_key(r["budget"])[0] == 0 for r in mine):
            budgets = sorted({float(r["budget"]) for r in mine if _budget_key(r["budget"])[0] == 0})
            if len(budgets) > 1 and budgets[0] > 0 and budgets[-1] / budgets[0] >= 8:
                ax.set_xscale("log", base=2)
        if mine:
            ax.legend(fontsize=8)
    axes[0][0].set_ylabel("Pass@1 (%)")
    axes[0][0].set_ylim(-2, 102)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    return buf.getvalue()


def write_report(run_dir: str | Path, *, n_boot: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Read `run_dir/runs.jsonl`; write `report.md`, `report.json` and `report.png` there (each
    atomically). Returns the summary dict that `report.json` holds."""
    run_dir = Path(run_dir)
    runs = load_runs(run_dir / "runs.jsonl")
    if not runs:
        raise KvagentError(f"{run_dir / 'runs.jsonl'} holds no finished runs yet")
    summary = summarize(runs, n_boot=n_boot, seed=seed)
    summary.update(environment_facts(runs))
    atomic_write_json(run_dir / "report.json", _json_safe(summary))
    atomic_write_text(run_dir / "report.md", render_markdown(summary))
    atomic_write_bytes(run_dir / "report.png", render_plot(summary))
    return summary


def _json_safe(obj: Any) -> Any:
    # JSON has no NaN; null reads better in every consumer.
    if isinstance(obj, float) and math.isnan(obj):
        return None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_json_safe(v) for v in obj]
    return obj
