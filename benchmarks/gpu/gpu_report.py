"""Goals, memory arithmetic and the Markdown report of a GPU run (from the result dict alone)."""

from __future__ import annotations

import math

from gpu_decode import ratio
from gpu_oracle import BF16_C, BF16_FLOOR, F32_TOL

TOLERANCE = {
    "float32": f"max |logit error| <= {F32_TOL:g}",
    "bfloat16": f"max |logit error| <= max({BF16_C:g} x the full policy's error on the same episode, "
    f"{BF16_FLOOR:g} x max |reference logit|)",
}
ROUND_GOALS = {"random": 0.005, "nexus": 0.02}
FLAT = 1.2  # evicting step at the longest length / at the shortest
GROWS = 1.1  # dense step at the longest length / at the shortest must exceed this
GIB = 2**30


def label(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def memory_summary(prod: dict, peaks: dict, total: int, plan: dict, device) -> dict:
    """Bytes per session (evicting after a round, dense at the longest length) and the largest number
    of sessions that fit beside the weights, from measured bytes and the measured peak overhead."""
    weights = prod["model"]["weights_bytes"]
    longest = plan["lengths"][-1]
    evict = [r["kv_bytes"] for r in prod["round"]] or [
        r["kv_bytes"] for r in prod["decode"] if r["policy"] != "full"
    ]
    dense = [r["kv_bytes"] for r in prod["decode"] if r["policy"] == "full" and r["length"] == longest]
    per_tok = prod["model"]["kv_bytes_per_token"]
    pos_bytes = 8 * prod["model"]["layers"] * (per_tok // (4 * prod["model"]["layers"] or 1)) // 128
    dense_bytes = dense[0] if dense else longest * (per_tok + pos_bytes)
    # Activations and allocator slack seen at an evicting session's peak, beyond weights and its
    # cache: the serving case (decode plus observation-sized prefill chunks). The dense 64k
    # prefill's transient is left out, which can only overstate how many dense sessions fit.
    over = [
        v["peak_bytes"] - weights - (v["kv_bytes"] or 0)
        for p, v in peaks.items()
        if p != "full" and v.get("peak_bytes") is not None
    ]
    reserve = max([0, *over])
    usable = total - weights - reserve - int(0.05 * total)
    evict_bytes = max(evict) if evict else None
    return {
        "device_total_bytes": total,
        "weights_bytes": weights,
        "evicting_session_bytes": evict_bytes,
        "dense_session_bytes": dense_bytes,
        "dense_length": longest,
        "dense_source": "measured" if dense else "computed from bytes per token",
        "activation_reserve_bytes": reserve,
        "evicting_n_max": usable // evict_bytes if evict_bytes else None,
        "dense_n_max": usable // dense_bytes if dense_bytes else None,
        "peak_by_policy": peaks,
    }


def _deep_rows(res: dict) -> tuple[list[dict], str]:
    """Decode rows through every length for evicting policies: production if it ran them all,
    else the long part's."""
    prod = res.get("production", {})
    long = res.get("long", {})
    if long.get("decode"):
        return long["decode"], f"long part, {long['depth']} layers"
    return prod.get("decode", []), f"production, {prod.get('model', {}).get('layers')} layers"


def goals(res: dict) -> list[dict]:
    out = []
    prod = res.get("production", {})
    plan = prod.get("plan", {})
    lengths = plan.get("lengths") or [0]
    lo, hi = lengths[0], lengths[-1]
    rounds = {r["policy"]: r for r in prod.get("round", [])}
    for p, goal in ROUND_GOALS.items():
        v = rounds.get(p, {}).get("round_share")
        out.append(
            _goal(
                f"{p}: eviction-round cost / decode time <= {goal:.1%}",
                v,
                goal,
                v is not None and v <= goal,
                "production",
            )
        )
    rows, where = _deep_rows(res)
    for p in dict.fromkeys(r["policy"] for r in rows if r["policy"] != "full"):
        v = ratio(rows, p, lo, hi)
        out.append(
            _goal(
                f"{p}: step at L={label(hi)} / step at L={label(lo)} <= {FLAT}x",
                v,
                FLAT,
                v is not None and v <= FLAT,
                where,
            )
        )
    v = ratio(prod.get("decode", []), "full", lo, hi)
    out.append(
        _goal(
            f"full (dense): step at L={label(hi)} / step at L={label(lo)} > {GROWS}x (grows)",
            v,
            GROWS,
            v is not None and v > GROWS,
            "production",
        )
    )
    return out


def _goal(name, value, threshold, ok, where) -> dict:
    return {
        "goal": name,
        "value": value,
        "threshold": threshold,
        "pass": ok if value is not None else None,
        "where": where,
    }


def _f(x, fmt="{:.2f}") -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else fmt.format(x)


def _verdict(ok) -> str:
    return "not measured" if ok is None else ("pass" if ok else "FAIL")


def markdown(res: dict) -> str:
    m = res["meta"]
    lines = [
        "# kvagent GPU run",
        "",
        f"{m['date']}, {m['device']} ({m['device_name']}), torch {m['torch']} (CUDA {m['cuda']}), "
        f"transformers {m['transformers']}, Python {m['python']}; {m.get('elapsed_s', 0):.0f} s of a "
        f"{m['budget_s']:.0f} s cap{' (QUICK: tiny shapes, a smoke run; the numbers mean nothing)' if m['quick'] else ''}.",
    ]
    if m.get("aborted"):
        lines += ["", f"**Aborted: {m['aborted']}.**"]
    if m.get("peak_bytes") is not None:
        lines += ["", f"Peak memory: {m['peak_bytes'] / GIB:.2f} GiB ({m['peak_kind']})."]
    if res.get("goals"):
        lines += [
            "",
            "## Goals (ratios from this run)",
            "",
            "| goal | value | where | result |",
            "|---|---|---|---|",
        ]
        for g in res["goals"]:
            v = g["value"]
            shown = _f(v, "{:.2%}") if "cost" in g["goal"] else _f(v, "{:.2f}x")
            lines.append(f"| {g['goal']} | {shown} | {g['where']} | {_verdict(g['pass'])} |")
    lines += _oracle(res.get("oracle"))
    lines += _production(res.get("production"), m.get("sdpa"))
    lines += _long(res)
    lines += _batched(res.get("batched"))
    if res.get("skipped"):
        lines += ["", "## Skipped", ""] + [
            f"- {s['part']}: {s['what']}: {s['reason']}" for s in res["skipped"]
        ]
    return "\n".join(lines) + "\n"


def _oracle(o) -> list[str]:
    if not o:
        return []
    lines = ["", "## 1. Oracle: every policy vs masked full attention (tiny models)", ""]
    lines += [f"- {k}: {v}" for k, v in o["tolerance"].items()]
    lines += [
        "",
        "| model | dtype | policy | rounds | max abs err | unevicted err | tolerance | result |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in o["rows"]:
        if "error" in r:
            lines.append(
                f"| {r['model']} | {r['dtype']} | {r['policy']} | - | - | - | - | ERROR {r['error'][:80]} |"
            )
            continue
        res = "reference" if r.get("reference") and r["dtype"] != "float32" else _verdict(r["pass"])
        lines.append(
            f"| {r['model']} | {r['dtype']} | {r['policy']} | {r['rounds']} | {r['err']:.3g} | "
            f"{_f(r.get('unevicted_err'), '{:.3g}')} | {r['tol']:.3g} | {res} |"
        )
    return lines


def _production(p, sdpa) -> list[str]:
    if not p:
        return []
    mdl, plan = p["model"], p["plan"]
    lines = [
        "",
        "## 2. Production shape",
        "",
        f"{mdl['shape']}, {mdl['layers']} of {mdl['full_depth']} layers, {mdl['params'] / 1e9:.2f}B parameters, "
        f"{mdl['dtype']}, weights {mdl['weights_bytes'] / GIB:.1f} GiB, built on the device in {mdl['build_s']:.1f} s; "
        f"K={plan['budget']}, r={plan['buffer']}, {plan['steps']} timed decode steps per row after {plan['warm']} untimed.",
    ]
    if sdpa:
        lines += [
            "",
            f"SDPA kernels: decode step {sdpa['decode']}; prefill chunk on a cache (bool mask + GQA) {sdpa['chunk_on_cache']}.",
        ]
    lines += _decode_table(p["decode"], plan["lengths"], "Decode step, ms (rows end at L):")
    if p["round"]:
        lines += [
            "",
            "Eviction-round cost as a share of decode time (2r steps from one token short of a round, after a warm-up round):",
            "",
            "| policy | L | rounds | step ms | scoring | compaction | round (synced) | goal |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in p["round"]:
            g = ROUND_GOALS.get(r["policy"])
            lines.append(
                f"| {r['policy']} | {r['length']} | {r['rounds']} | {r['step_ms']:.2f} | {r['scoring_share']:.2%} | "
                f"{r['compaction_share']:.2%} | {r['round_share']:.2%} | {'<= ' + format(g, '.1%') if g else '-'} |"
            )
    if p["prefill"]:
        lines += ["", "Prefill on the way (tokens/s; evicting prefill runs a round every r tokens):", ""]
        lines += ["| policy | to L | tokens | s | tok/s |", "|---|---|---|---|---|"]
        for g in p["prefill"]:
            lines.append(
                f"| {g['policy']} | {g['to_length']} | {g['tokens']} | {g['seconds']:.2f} | {g['tok_s']:.0f} |"
            )
    mem = p.get("memory") or {}
    if mem:
        e, d = mem["evicting_session_bytes"], mem["dense_session_bytes"]
        lines += [
            "",
            f"Memory: device {mem['device_total_bytes'] / GIB:.1f} GiB, weights {mem['weights_bytes'] / GIB:.1f} GiB, "
            f"activation reserve {mem['activation_reserve_bytes'] / GIB:.2f} GiB (measured peak overhead).",
            f"KV per session: evicting (after a round: K + r, K + 2r at most) {_f(e and e / GIB, '{:.3f}')} GiB; dense at L={label(mem['dense_length'])} "
            f"{d / GIB:.3f} GiB ({mem['dense_source']}); dense / evicting {_f(e and d / e, '{:.1f}x')}.",
            f"Largest N sessions that fit beside the weights: evicting {mem['evicting_n_max']}, dense {mem['dense_n_max']}.",
        ]
    return lines


def _decode_table(rows, lengths, title) -> list[str]:
    if not rows:
        return []
    lo, hi = lengths[0], lengths[-1]
    by = {(r["policy"], r["length"]): r for r in rows}
    lines = [
        "",
        title,
        "",
        "| policy | "
        + " | ".join(f"L={label(n)}" for n in lengths)
        + f" | {label(hi)}/{label(lo)} | KV MiB at longest |",
    ]
    lines.append("|---" * (len(lengths) + 3) + "|")
    for p in dict.fromkeys(r["policy"] for r in rows):
        cells = [_f(by.get((p, n), {}).get("step_ms")) for n in lengths]
        last = next((by[(p, n)] for n in reversed(lengths) if (p, n) in by), None)
        kv = _f(last and last["kv_bytes"] / 2**20, "{:.0f}")
        lines.append(f"| {p} | " + " | ".join(cells) + f" | {_f(ratio(rows, p, lo, hi), '{:.2f}x')} | {kv} |")
    return lines


def _long(res) -> list[str]:
    long = res.get("long")
    if not long:
        return []
    plan = res["production"]["plan"]
    lines = [
        "",
        f"## 3. Long: every policy through {', '.join(label(n) for n in plan['lengths'])} at {long['depth']} layers",
    ]
    if long.get("note"):
        return lines + ["", long["note"] + "."]
    lines += [
        "",
        "Same per-layer shape, fewer layers, so each evicting session reaches the longest length by real "
        "chunked prefill with eviction inside the time cap; ratios are within this depth.",
    ]
    lines += _decode_table(long["decode"], plan["lengths"], "Decode step, ms:")
    est = estimate_full_depth(res)
    if est:
        lines += [
            "",
            f"Estimated at {res['production']['model']['layers']} layers (production step at L={label(plan['lengths'][0])} x this part's length ratio), ms:",
            "",
        ]
        lines += [
            "| policy | " + " | ".join(f"L={label(n)}" for n in plan["lengths"]) + " |",
            "|---" * (len(plan["lengths"]) + 1) + "|",
        ]
        for p, cells in est.items():
            lines.append(f"| {p} | " + " | ".join(_f(c) for c in cells) + " |")
    return lines


def estimate_full_depth(res) -> dict:
    prod, long = res.get("production", {}), res.get("long", {})
    lengths = prod.get("plan", {}).get("lengths", [])
    if not long.get("decode") or not lengths:
        return {}
    base = {r["policy"]: r["step_ms"] for r in prod["decode"] if r["length"] == lengths[0]}
    out = {}
    for p in dict.fromkeys(r["policy"] for r in long["decode"]):
        if p == "full" or p not in base:
            continue
        out[p] = [
            None
            if ratio(long["decode"], p, lengths[0], n) is None
            else base[p] * ratio(long["decode"], p, lengths[0], n)
            for n in lengths
        ]
    return out


def _n(row: dict) -> str:
    asked = row.get("asked_n", row["n"])
    return str(row["n"]) if asked == row["n"] else f"{row['n']} (largest that fits; {asked} asked)"


def _batched(b) -> list[str]:
    if b is None:
        return []
    lines = ["", "## 4. Batched engine", ""]
    if not b["landed"]:
        return lines + [f"Skipped: {b['reason']}."]
    lines += [
        "| N | policy | K | tokens/s | vs N=1 | step ms | prefill s | KV GiB/session |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in b["rows"]:
        lines.append(
            f"| {_n(r)} | {r['policy']} | {r['budget']} | {r['tokens_s']:.1f} | {_f(r['speedup_vs_n1'], '{:.2f}x')} | "
            f"{r['step_ms']:.2f} | {r['prefill_s']:.1f} | {r['kv_bytes_per_session'] / GIB:.3f} |"
        )
    return lines
