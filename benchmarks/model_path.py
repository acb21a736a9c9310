"""The eager forward through the decoder (`Decoder.forward`, the one model path) against the same
forward through transformers' modules, side by side on one engine: blocks alternate the two paths
(`engine.model_path` set or None), so load from other jobs hits both alike. Two timed blocks per
round: a prefill of `--length` tokens into a fresh session (appended in `--chunk`-token chunks, as
a tool output or a re-prefill rebuild arrives), and `--steps` dense decode steps (policy full: the
eager route, which the static step never takes). Reports each path's median CPU time (one torch
thread) and the ratio decoder / modules, the median over rounds.

    .venv/bin/python benchmarks/model_path.py [--model smollm2] [--dtype float32] [--rounds 12]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvagent.cli.settings import add_arguments, engine_of  # noqa: E402
from kvagent.runtime import CacheConfig, Engine  # noqa: E402


def prefill_ms(engine, tokens: list[int], chunk: int) -> float:
    session = engine.session(CacheConfig())
    c0 = time.thread_time()
    for i in range(0, len(tokens), chunk):
        session.append(tokens[i : i + chunk])
    return 1000 * (time.thread_time() - c0)


def decode_ms(engine, tokens: list[int], steps: int) -> float:
    session = engine.session(CacheConfig())
    session.append(tokens)
    c0 = time.thread_time()
    for t in tokens[:steps]:
        session.step(t)
    return 1000 * (time.thread_time() - c0) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(ap, engine=["model", "dtype"], model="smollm2", dtype="float32")
    ap.add_argument(
        "--length", type=int, default=512, help="prompt tokens (prefill), and the decode's context"
    )
    ap.add_argument("--chunk", type=int, default=512, help="tokens per prefill append")
    ap.add_argument("--steps", type=int, default=16, help="dense decode steps per timed block")
    ap.add_argument("--rounds", type=int, default=12, help="timed rounds (each: both paths, both blocks)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    options = engine_of(args)
    engine = Engine.load(options.model, device="cpu", dtype=options.dtype)
    if engine.model_path is None:
        ap.error(f"--model {options.model}: its architecture has no decoder, so there is nothing to compare")
    decoder = engine.model_path
    vocab = int(engine.model.config.vocab_size)
    tokens = torch.randint(10, vocab, (args.length,), generator=torch.Generator().manual_seed(0)).tolist()
    times: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds + 1):  # round 0 warms both paths up and is not kept
        for name, path in (("modules", None), ("decoder", decoder)) if r % 2 else (
            ("decoder", decoder), ("modules", None)):  # fmt: skip
            engine.model_path = path
            p, d = prefill_ms(engine, tokens, args.chunk), decode_ms(engine, tokens, args.steps)
            if r:
                times.setdefault((name, "prefill"), []).append(p)
                times.setdefault((name, "decode"), []).append(d)
    engine.model_path = decoder
    print(
        f"{options.model} {options.dtype}, one torch thread, L = {args.length}, {args.rounds} rounds (CPU ms)"
    )
    print("| block | modules | decoder | decoder / modules |")
    print("|---|---|---|---|")
    for block, label in (
        ("prefill", f"prefill {args.length} in {args.chunk}s"),
        ("decode", "dense decode step"),
    ):
        mods, decs = times[("modules", block)], times[("decoder", block)]
        ratio = statistics.median(d / m for d, m in zip(decs, mods, strict=True))
        print(f"| {label} | {statistics.median(mods):.1f} | {statistics.median(decs):.1f} | {ratio:.3f} |")


if __name__ == "__main__":
    main()
