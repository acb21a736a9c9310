"""Markdown tables of fidelity records (one row per setting, averaged over episodes)."""

from __future__ import annotations

import math
from collections import defaultdict

from kvagent.runspec import RunSpec

# What the tables show as columns; any other setting that sets a run apart (its label's other
# parts) joins the policy's name: `snapkv+adaptive`.
COLUMNS = ("scope", "protect", "framework")


def setting(record: dict) -> RunSpec:
    """The setting a record belongs to (records of every seed and episode share it)."""
    return RunSpec.from_record(record).configuration


def row_name(cfg: RunSpec) -> str:
    return "+".join([cfg.policy, *(str(getattr(cfg, k)) for k in cfg.varied if k not in COLUMNS)])


def _mean(xs):
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return sum(xs) / len(xs) if xs else None


def _fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def fidelity_rows(records: list[dict]) -> list[dict]:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        if r.get("status") == "ok":  # a replay under observation masking is its own row
            groups[(setting(r), r.get("history"))].append(r)
    rows = []
    for (cfg, history), rs in groups.items():
        retrieved = [r["probe_retrieved"] for r in rs if r.get("probe_retrieved") is not None]
        rows.append(
            {
                **{k: getattr(cfg, k) for k in ("mode", "budget", *COLUMNS, *cfg.varied)},
                "policy": row_name(cfg) + (f"+{history}" if history else ""),
                "episodes": len(rs),
                "kl": _mean([r["kl"] for r in rs]),
                "top1": _mean([r["top1"] for r in rs]),
                "logp_true": _mean([r["logp_true"] for r in rs]),
                "retrieval": (sum(retrieved) / len(retrieved)) if retrieved else None,
                "probe_logp": _mean([r.get("probe_logp") for r in rs]),
                "rounds": _mean([r.get("rounds") for r in rs]),
                "kv_mib": _mean([(r.get("kv_bytes") or 0) / 2**20 for r in rs]),
                "wall_s": _mean([r.get("wall_s") for r in rs]),
            }
        )
    order = {"full": 0}
    rows.sort(
        key=lambda r: (
            order.get(r["policy"], 1),
            r["mode"],
            r["scope"],
            r["protect"],
            r["framework"],
            -1 if r["budget"] is None else r["budget"],
            r["policy"],
        )
    )
    return rows


def fidelity_markdown(records: list[dict], skipped: list[str] | None = None) -> str:
    head = (
        "| policy | mode | scope | protect | framework | K | episodes | mean KL(full‖policy) | top-1 agree | "
        "mean log p(true) | fact retrieved | log p(fact) | rounds | KV MiB | wall s |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in fidelity_rows(records):
        full = r["policy"] == "full"
        lines.append(
            f"| {r['policy']} | {'-' if full else r['mode']} | {'-' if full else r['scope']} | "
            f"{'-' if full else r['protect']} | {'-' if full else r['framework']} | "
            f"{'dense' if r['budget'] is None else r['budget']} | {r['episodes']} | "
            f"{_fmt(r['kl'], '.4f')} | {_fmt(r['top1'], '.1%')} | {_fmt(r['logp_true'], '.3f')} | "
            f"{_fmt(r['retrieval'], '.0%')} | {_fmt(r['probe_logp'], '.2f')} | {_fmt(r['rounds'], '.0f')} | "
            f"{_fmt(r['kv_mib'], '.1f')} | {_fmt(r['wall_s'], '.1f')} |"
        )
    if any(r.get("reused_tokens") for r in records):
        lines += ["", "wall s: the replay's. Its reprefill rebuilds start from the previous rebuild's dense "
                  "state (the same logits, fewer forwards), so they do not time the protocol: "
                  "`kvagent bench speed` does."]  # fmt: skip
    if skipped:
        lines += ["", "Skipped:", *[f"- {s}" for s in skipped]]
    return "\n".join(lines) + "\n"
