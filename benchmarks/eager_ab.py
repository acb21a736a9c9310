"""The eager route two ways, side by side, blocks alternating between them so load from other jobs
hits both alike. Per round and side: a prefill of `--length` tokens into a fresh dense session
(appended in `--chunk`-token pieces, as a tool output or a re-prefill rebuild arrives), then
`--steps` dense decode steps (policy full: the eager forward, which the static step never takes).
Reports each side's median CPU time (one torch thread) and the ratio B / A, the median over rounds.

`--compare path`: A = transformers' modules, B = the decoder (`Decoder.forward`, the one model
path), on one engine (`engine.model_path` None or set). `--compare linear`: A = plain weights, B =
oneDNN-packed ones (`--linear plain` / `packed`), two engines over copies of one model: what
decides `--linear auto` for a dtype (runtime/linear.py).

    .venv/bin/python benchmarks/eager_ab.py --compare path [--model smollm2] [--rounds 8]
    .venv/bin/python benchmarks/eager_ab.py --compare linear --dtype bfloat16 [--rounds 6]
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


def one_round(engine, tokens: list[int], chunk: int, steps: int) -> tuple[float, float]:
    """(prefill ms, decode ms a step) in this thread's CPU time."""
    session = engine.session(CacheConfig())
    c0 = time.thread_time()
    for i in range(0, len(tokens), chunk):
        session.append(tokens[i : i + chunk])
    prefill = time.thread_time() - c0
    c0 = time.thread_time()
    for t in tokens[:steps]:
        session.step(t)
    return 1000 * prefill, 1000 * (time.thread_time() - c0) / steps


def sides(compare: str, model: str, dtype: str) -> dict:
    """name -> a function that readies its side and returns the engine to time."""
    if compare == "path":
        engine = Engine.load(model, device="cpu", dtype=dtype)
        if engine.model_path is None:
            raise SystemExit(
                f"--model {model}: its architecture has no decoder, so there is nothing to compare"
            )
        decoder = engine.model_path

        def use(path):
            engine.model_path = path
            return engine

        return {"modules": lambda: use(None), "decoder": lambda: use(decoder)}
    plain = Engine.load(model, device="cpu", dtype=dtype, linear="plain")
    packed = Engine.load(copy.deepcopy(plain.model), tokenizer=plain.tokenizer, device="cpu", dtype=dtype,
                         linear="packed")  # fmt: skip
    return {"plain": lambda: plain, "packed": lambda: packed}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--compare", choices=("path", "linear"), required=True, help="what the two sides differ in"
    )
    add_arguments(ap, engine=["model", "dtype"], model="smollm2", dtype="float32")
    ap.add_argument("--length", type=int, default=512, help="prompt tokens, and the decode's context")
    ap.add_argument("--chunk", type=int, default=512, help="tokens per prefill append")
    ap.add_argument("--steps", type=int, default=16, help="dense decode steps per timed block")
    ap.add_argument("--rounds", type=int, default=8, help="timed rounds (each: both sides)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    options = engine_of(args)
    ready = sides(args.compare, options.model, options.dtype)
    (a, b), engine = list(ready), next(iter(ready.values()))()
    vocab = int(engine.model.config.vocab_size)
    tokens = torch.randint(10, vocab, (args.length,), generator=torch.Generator().manual_seed(0)).tolist()
    times: dict[str, list[tuple[float, float]]] = {a: [], b: []}
    for r in range(args.rounds + 1):  # round 0 warms both up and is not kept
        for name in (a, b) if r % 2 else (b, a):
            t = one_round(ready[name](), tokens, args.chunk, args.steps)
            if r:
                times[name].append(t)
    print(
        f"{options.model} {engine.dtype}, one torch thread, L = {args.length}, {args.rounds} rounds (CPU ms)"
    )
    print(f"| block | {a} | {b} | {b} / {a} |")
    print("|---|---|---|---|")
    for i, label in enumerate((f"prefill {args.length} in {args.chunk}s", "dense decode step")):
        xs, ys = [t[i] for t in times[a]], [t[i] for t in times[b]]
        ratio = statistics.median(y / x for x, y in zip(xs, ys, strict=True))
        print(f"| {label} | {statistics.median(xs):.1f} | {statistics.median(ys):.1f} | {ratio:.3f} |")


if __name__ == "__main__":
    main()
