"""oneDNN-packed weights (`--linear packed`) against plain ones (`--linear plain`) on the eager
route, side by side: two engines over copies of one model, blocks alternating between them, so
load from other jobs hits both alike. Per round: a prefill of `--length` tokens into a fresh dense
session, then `--steps` dense decode steps (policy full: the eager forward). Reports each median
CPU time (one torch thread) and the ratio packed / plain, the median over rounds. What decides
`--linear auto` for a dtype (runtime/linear.py).

    .venv/bin/python benchmarks/packed_weights.py --dtype bfloat16 [--model smollm2] [--rounds 6]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvagent.cli.settings import add_arguments, engine_of  # noqa: E402
from kvagent.runtime import CacheConfig, Engine  # noqa: E402


def one_round(engine, tokens: list[int], steps: int) -> tuple[float, float]:
    """(prefill ms, decode ms a step) in this thread's CPU time."""
    session = engine.session(CacheConfig())
    c0 = time.thread_time()
    session.append(tokens)
    prefill = time.thread_time() - c0
    c0 = time.thread_time()
    for t in tokens[:steps]:
        session.step(t)
    return 1000 * prefill, 1000 * (time.thread_time() - c0) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(ap, engine=["model", "dtype"], model="smollm2", dtype="bfloat16")
    ap.add_argument("--length", type=int, default=512, help="prompt tokens, and the decode's context")
    ap.add_argument("--steps", type=int, default=16, help="dense decode steps per timed block")
    ap.add_argument("--rounds", type=int, default=6, help="timed rounds (each: both engines)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    options = engine_of(args)
    plain = Engine.load(options.model, device="cpu", dtype=options.dtype, linear="plain")
    packed = Engine.load(
        copy.deepcopy(plain.model),
        tokenizer=plain.tokenizer,
        device="cpu",
        dtype=options.dtype,
        linear="packed",
    )
    engines = {"plain": plain, "packed": packed}
    vocab = int(plain.model.config.vocab_size)
    tokens = torch.randint(10, vocab, (args.length,), generator=torch.Generator().manual_seed(0)).tolist()
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in engines}
    for r in range(args.rounds + 1):  # round 0 warms both up and is not kept
        for name in list(engines) if r % 2 else list(engines)[::-1]:
            t = one_round(engines[name], tokens, args.steps)
            if r:
                times[name].append(t)
    print(
        f"{options.model} {plain.dtype}, one torch thread, L = {args.length}, {args.rounds} rounds (CPU ms)"
    )
    print("| block | plain | packed | packed / plain |")
    print("|---|---|---|---|")
    for i, label in enumerate((f"prefill {args.length}", "dense decode step")):
        a, b = [t[i] for t in times["plain"]], [t[i] for t in times["packed"]]
        ratio = statistics.median(y / x for x, y in zip(a, b, strict=True))
        print(f"| {label} | {statistics.median(a):.1f} | {statistics.median(b):.1f} | {ratio:.3f} |")


if __name__ == "__main__":
    main()
