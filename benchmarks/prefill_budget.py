"""The batcher's prefill budget, on and off, side by side in one run: N concurrent sessions on
one batching engine, each alternating a prompt append (a tool output of P tokens) and G decoded
tokens, out of phase (session i decodes i * stagger tokens first), so prompt chunks keep landing
beside other sessions' decode tokens, as a server's conversations do. Rounds alternate the two
settings on the same engine (fresh sessions each round), so load from other jobs hits both alike.

Reports per setting: each session's decode rate (decoded tokens / seconds spent in its `step`
calls; median over sessions, then over rounds), the append latency (median), and the whole run's
output tokens/s. The budget trades a little prompt latency for decode rate; the table shows both.

    .venv/bin/python benchmarks/prefill_budget.py [--sessions 8] [--turns 3] [--rounds 3]
        [--policy full] [--budget-tokens 512] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from kvagent.cli.settings import add_arguments
from kvagent.runtime import CacheConfig, Engine

sys.path.insert(0, str(Path(__file__).parent))
from _threads import run_together  # noqa: E402
from decode_modes import cpu_name  # noqa: E402


def _ids(gen: torch.Generator, n: int, vocab: int) -> list[int]:
    return torch.randint(0, max(2, vocab - 512), (n,), generator=gen).tolist()


def conversation(engine, cfg, seed: int, args, stagger: int) -> dict:
    """One session's episode; returns its decode seconds/tokens and append latencies."""
    vocab = engine.model.config.vocab_size
    gen = torch.Generator().manual_seed(seed)
    s = engine.session(cfg)
    decode_s, decoded, appends = 0.0, 0, []
    t = time.perf_counter()
    logits = s.append(_ids(gen, args.prompt, vocab))
    appends.append(time.perf_counter() - t)
    plan = [stagger] + [args.reply] * args.turns
    for turn, steps in enumerate(plan):
        t = time.perf_counter()
        for _ in range(steps):
            logits = s.step(int(torch.argmax(logits)))
        decode_s += time.perf_counter() - t
        decoded += steps
        if turn < args.turns:
            size = int(torch.randint(args.tool // 2, args.tool * 3 // 2 + 1, (1,), generator=gen))
            t = time.perf_counter()
            logits = s.append(_ids(gen, size, vocab))
            appends.append(time.perf_counter() - t)
    return {"decode_s": decode_s, "decoded": decoded, "appends": appends}


def one_round(engine, budget: int | None, args, round_index: int) -> dict:
    engine.batcher.prefill_budget = budget
    cfg = CacheConfig(policy=args.policy, budget=args.budget, buffer=args.buffer, protect="sink", seed=1)
    results: list[dict] = [{} for _ in range(args.sessions)]

    def job(i):
        def run():
            results[i] = conversation(engine, cfg, 1000 * round_index + i, args, i * args.stagger)

        return run

    wall = run_together([job(i) for i in range(args.sessions)])
    rates = [r["decoded"] / r["decode_s"] for r in results if r["decode_s"] > 0]
    return {
        "decode_rate_median": statistics.median(rates),
        "append_s_median": statistics.median(a for r in results for a in r["appends"]),
        "output_tok_s": sum(r["decoded"] for r in results) / wall,
        "wall_s": wall,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # --budget: the cache's K (evicting policies); --budget-tokens: the prefill budget compared
    add_arguments(ap, one=["policy", "buffer"], tokens=["budget"], engine=["model", "dtype"], dtype="float32")
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=1200, help="first prompt tokens")
    ap.add_argument("--tool", type=int, default=500, help="mean tool-output tokens per turn (0.5x-1.5x)")
    ap.add_argument("--reply", type=int, default=32, help="decoded tokens per turn")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--stagger", type=int, default=4, help="session i decodes i*stagger tokens first")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per setting (alternating)")
    ap.add_argument("--budget-tokens", type=int, default=512, help="the prefill budget compared with none")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    engine = Engine.load(args.model, device="cpu", dtype=args.dtype, max_batch=args.sessions)
    settings = {"budget": args.budget_tokens, "none": None}
    rows: dict[str, list[dict]] = {k: [] for k in settings}
    one_round(engine, None, args, -1)  # warm-up, untimed
    for r in range(args.rounds):
        order = list(settings) if r % 2 == 0 else list(settings)[::-1]
        for name in order:
            rows[name].append(one_round(engine, settings[name], args, r))
            print(name, {k: round(v, 3) for k, v in rows[name][-1].items()}, flush=True)
    summary = {name: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for name, rs in rows.items()}
    b, n = summary["budget"], summary["none"]
    print(f"\nCPU {cpu_name()}, {args.dtype}, {torch.get_num_threads()} threads, "
          f"policy {args.policy}, {args.sessions} sessions, median of {args.rounds} rounds each")  # fmt: skip
    print("| setting | decode tok/s per session | append latency | output tok/s |")
    print("|---|---|---|---|")
    for name, s in summary.items():
        label = f"budget {args.budget_tokens}" if name == "budget" else "no budget"
        print(
            f"| {label} | {s['decode_rate_median']:.2f} | {s['append_s_median']:.2f} s | {s['output_tok_s']:.2f} |"
        )
    print(
        f"budget / none: decode per session {b['decode_rate_median'] / n['decode_rate_median']:.3f}x, "
        f"append latency {b['append_s_median'] / n['append_s_median']:.3f}x, "
        f"output {b['output_tok_s'] / n['output_tok_s']:.3f}x"
    )
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "rounds": rows,
                                         "summary": summary}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
