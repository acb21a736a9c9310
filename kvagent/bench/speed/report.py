"""`kvagent bench speed`'s output: the Markdown tables (`speed_markdown`) and the plot (`plot_speed`) of
one run's decode latencies, round costs and episode cost."""

from __future__ import annotations

from pathlib import Path


def speed_markdown(lat: list[dict], episode: list[dict], meta: dict) -> str:
    lines = [
        f"Model {meta['model']} on {meta['device']} ({meta['dtype']}), K={meta['budget']}, r={meta['buffer']} "
        f"({meta.get('framework', 'topk-all')}), {meta['steps']} decode steps per length; {meta['date']}.",
        "",
    ]
    lengths = sorted({r["length"] for r in lat})
    policies = list(dict.fromkeys(r["policy"] for r in lat))
    by = {(r["policy"], r["length"]): r for r in lat}
    lines += ["Decode step time (ms, eviction rounds amortised); ratio = longest / shortest length:", ""]
    lines.append("| policy | " + " | ".join(f"L={n}" for n in lengths) + " | ratio | ms vs full at longest |")
    lines.append("|---" * (len(lengths) + 3) + "|")
    full_last = by.get(("full", lengths[-1]))
    for p in policies:
        cells = [f"{by[(p, n)]['step_ms']:.2f}" for n in lengths]
        ratio = by[(p, lengths[-1])]["step_ms"] / by[(p, lengths[0])]["step_ms"]
        vs = f"{by[(p, lengths[-1])]['step_ms'] / full_last['step_ms']:.2f}x" if full_last else "-"
        lines.append(f"| {p} | " + " | ".join(cells) + f" | {ratio:.2f}x | {vs} |")
    lines += [
        "",
        "Eviction-round cost as a share of decode time (at the longest length), and KV memory:",
        "",
        "| policy | rounds | scoring | compaction | total | KV MiB | entries/head |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in policies:
        r = by[(p, lengths[-1])]
        lines.append(
            f"| {p} | {r['rounds']} | {r['scoring_share']:.2%} | {r['compaction_share']:.2%} | "
            f"{r['round_share']:.2%} | {r['kv_bytes'] / 2**20:.1f} | {r['entries']} |"
        )
    if episode:
        lines += [
            "",
            f"Persistent vs reprefill on a {episode[0]['turns']}-turn episode "
            f"({episode[0]['tokens']} tokens, policy {episode[0]['policy']}, K={episode[0]['budget']}: "
            "raised above the protected prompt when needed):",
            "",
            "| mode | prefill tokens | decode tokens | rounds | wall s | KV MiB |",
            "|---|---|---|---|---|---|",
        ]
        for r in episode:
            lines.append(
                f"| {r['mode']} | {r['prefill_tokens']} | {r['decode_tokens']} | {r['rounds']} | "
                f"{r['wall_s']:.1f} | {r['kv_bytes'] / 2**20:.1f} |"
            )
        if len(episode) == 2:
            a, b = episode
            lines.append(
                f"\nreprefill / persistent: {b['prefill_tokens'] / a['prefill_tokens']:.1f}x prefill tokens, "
                f"{b['wall_s'] / a['wall_s']:.2f}x wall time."
            )
    return "\n".join(lines) + "\n"


def plot_speed(lat: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kvagent.bench.plots import _save

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 3.6))
    policies = list(dict.fromkeys(r["policy"] for r in lat))
    for p in policies:
        pts = sorted((r["length"], r["step_ms"]) for r in lat if r["policy"] == p)
        a1.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=p)
    a1.set_xscale("log", base=2)
    a1.set_xlabel("logical length (tokens)")
    a1.set_ylabel("decode step (ms)")
    a1.legend(fontsize=7)
    a1.grid(alpha=0.3)
    longest = max(r["length"] for r in lat)
    last = [r for r in lat if r["length"] == longest]
    xs = range(len(last))
    a2.bar(xs, [100 * r["scoring_share"] for r in last], label="scoring")
    a2.bar(
        xs,
        [100 * r["compaction_share"] for r in last],
        bottom=[100 * r["scoring_share"] for r in last],
        label="compaction",
    )
    a2.set_xticks(list(xs), [r["policy"] for r in last], rotation=30, fontsize=8)
    a2.set_ylabel("% of decode time")
    a2.set_title(f"eviction-round cost at L={longest}", fontsize=9)
    a2.legend(fontsize=7)
    fig.tight_layout()
    out = _save(fig, Path(path))
    plt.close(fig)
    return out
