"""Runtime overhead, side by side in one run on the CPU:

1. per-token decode time of a `Session` with policy `full` vs plain `model.generate` with
   `DynamicCache` on the same weights (goal: <= 1.05x);
2. decode step time at logical lengths 1k / 4k / 16k with K=1k (goal: flat within 1.2x) vs `full`
   (grows with the length).

    .venv/bin/python benchmarks/runtime_speed.py [--quick] [--policy random]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import _model  # noqa: E402

from kvagent.bench.speed.run import decode_latency  # noqa: E402
from kvagent.cli.settings import add_arguments  # noqa: E402
from kvagent.runtime import CacheConfig, Engine  # noqa: E402


def hf_per_token(ref, prompt: torch.Tensor, n: int) -> float:
    """Seconds per generated token of model.generate (prefill removed by differencing)."""
    from transformers import DynamicCache

    def gen(k):
        t0 = time.perf_counter()
        ref.generate(
            prompt,
            max_new_tokens=k,
            min_new_tokens=k,
            do_sample=False,
            past_key_values=DynamicCache(config=ref.config),
            pad_token_id=0,
        )
        return time.perf_counter() - t0

    return (gen(n) - gen(1)) / (n - 1)


def session_per_token(engine, prompt: list[int], n: int) -> float:
    s = engine.session(CacheConfig(policy="full"))
    logits = s.append(prompt)
    t0 = time.perf_counter()
    for _ in range(n):  # greedy, like generate
        logits = s.step(int(torch.argmax(logits)))
    return (time.perf_counter() - t0) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small model and lengths (a smoke run)")
    add_arguments(ap, one=["policy"], policy="random")  # the evicting policy of the length sweep
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = _model.build(args.quick)
    ref = copy.deepcopy(model)  # before Engine.load, which switches the attention implementation
    engine = Engine.load(model, tokenizer=_model.tokenizer(), device="cpu")
    print(
        f"model: Qwen3-shaped random, {_model.n_params(model) / 1e6:.0f}M params, {engine.n_layers} layers; "
        f"CPU threads {torch.get_num_threads()}; {time.strftime('%Y-%m-%d %H:%M')}"
    )

    prompt_len, n = (256, 32) if args.quick else (512, 64)
    prompt = torch.randint(0, 1000, (1, prompt_len))
    hf, ours = [], []
    for _ in range(args.repeats):  # alternate, so drifting machine load hits both alike
        hf.append(hf_per_token(ref, prompt, n))
        ours.append(session_per_token(engine, prompt[0].tolist(), n))
    h, o = statistics.median(hf), statistics.median(ours)
    print(f"\n1) per-token decode, prompt {prompt_len}, {n} tokens, median of {args.repeats}")
    print(f"   model.generate + DynamicCache : {1000 * h:8.2f} ms")
    print(f"   Session(policy=full).step     : {1000 * o:8.2f} ms")
    print(f"   ratio Session / generate      : {o / h:8.3f}x   (goal <= 1.05x)")

    lengths, k, steps = ([512, 1024, 2048], 256, 128) if args.quick else ([1024, 4096, 16384], 1024, 256)
    print(f"\n2) decode step vs logical length, K={k}, r=128, {steps} steps per length (rounds amortised)")
    rows = {}
    for p in ("full", args.policy):
        for r in decode_latency(engine, p, lengths, k, 128, steps):
            rows[(p, r["length"])] = r
    print("   policy     " + "".join(f"{'L=' + str(n_):>12}" for n_ in lengths) + "   longest/shortest")
    for p in ("full", args.policy):
        ms = [rows[(p, n_)]["step_ms"] for n_ in lengths]
        print(f"   {p:<10} " + "".join(f"{m:10.2f}ms" for m in ms) + f"   {ms[-1] / ms[0]:.2f}x")
    print(f"   goal: {args.policy} flat within 1.2x; full grows")


if __name__ == "__main__":
    main()
