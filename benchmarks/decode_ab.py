"""Solo decode step latency of two checkouts of kvagent, side by side in one run: the child
process (one per checkout per round, alternating, so machine load hits both alike) times
`Session.step` on one engine for a few cache configs; the driver reports each config's median step
time per checkout and the ratio after / before. For refactors of the runtime's forward path.

    .venv/bin/python benchmarks/decode_ab.py --before /tmp/kv_before [--model smollm2] [--rounds 5]

`--before DIR` is a directory holding an older `kvagent/` package (e.g. `git archive REV kvagent |
tar -x -C DIR`); "after" is this checkout, or `--after DIR`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# (policy, budget): the dense path, and evicting ones whose rounds fire during the timed steps.
CONFIGS = (("full", None), ("random", 256), ("snapkv", 256))


def child(model: str, length: int, steps: int, reps: int) -> dict:
    import torch

    from kvagent.runtime import CacheConfig, Engine

    torch.set_num_threads(1)  # a shared machine: one thread is the steadiest measure
    engine = Engine.load(model, device="cpu", dtype="float32")
    gen = torch.Generator().manual_seed(0)
    vocab = int(engine.model.config.vocab_size)
    out = {}
    for policy, budget in CONFIGS:
        cfg = CacheConfig(policy=policy, budget=budget, buffer=32, protect="sink")
        s = engine.session(cfg)
        s.append(torch.randint(0, vocab - 512, (length,), generator=gen).tolist())
        toks = torch.randint(0, vocab - 512, (steps * (reps + 1),), generator=gen).tolist()
        for t in toks[:steps]:  # warm-up
            s.step(t)
        times = []
        for r in range(1, reps + 1):
            t0 = time.perf_counter()
            for t in toks[r * steps : (r + 1) * steps]:
                s.step(t)
            times.append((time.perf_counter() - t0) / steps)
        out[f"{policy}/{budget}"] = 1000 * min(times)
    return out


def run_child(pythonpath: Path, args) -> dict:
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--model", args.model]
    cmd += ["--length", str(args.length), "--steps", str(args.steps), "--reps", str(args.reps)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, help="directory holding the older kvagent/ package")
    ap.add_argument(
        "--after", type=Path, default=ROOT, help="directory holding the newer one (this checkout)"
    )
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--length", type=int, default=512, help="tokens prefilled before timing")
    ap.add_argument("--steps", type=int, default=64, help="decode steps per timed repetition")
    ap.add_argument("--reps", type=int, default=3, help="timed repetitions per child (the fastest counts)")
    ap.add_argument("--rounds", type=int, default=5, help="child runs per checkout, alternating")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.model, args.length, args.steps, args.reps)))
        return
    if args.before is None or not (args.before / "kvagent").is_dir():
        ap.error("--before DIR must hold a kvagent/ package (git archive REV kvagent | tar -x -C DIR)")
    runs = {"before": [], "after": []}
    for i in range(args.rounds):
        order = [("before", args.before), ("after", args.after)]
        for name, path in order if i % 2 == 0 else order[::-1]:
            runs[name].append(run_child(path, args))
    print(
        f"model {args.model}, L={args.length}, {args.rounds} rounds x {args.reps} reps x {args.steps} steps"
    )
    print(f"{'config':<14}{'before ms':>11}{'after ms':>11}{'after/before':>14}")
    for key in runs["before"][0]:
        b = statistics.median(r[key] for r in runs["before"])
        a = statistics.median(r[key] for r in runs["after"])
        print(f"{key:<14}{b:>11.3f}{a:>11.3f}{a / b:>14.3f}")


if __name__ == "__main__":
    main()
