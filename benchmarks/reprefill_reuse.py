"""Reprefill replays with and without `Session.reuse_prefix`, side by side in one run: wall time,
tokens run through prefill forwards, and whether every scored position's KL is the same.

A bundled real trajectory per episode id, cut at whole turns to --max-tokens, replayed on SmolLM2
in reprefill mode (the study's Nexus settings by default: r = 32, W = 16, protect=sink, K = 0.1 of
the episode). The two replays of a pair run back to back, in alternating order from pair to pair,
so that a change in the machine's load falls on both.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/reprefill_reuse.py --ids A,B [--policies snapkv,nexus]
        [--episodes bundled] [--max-tokens 8000] [--fraction 0.1]

`bundled` (the default) is the study's episode file, built once by `kvagent bench episodes build`.
"""

from __future__ import annotations

import argparse
import math
import time

from kvagent.bench import replay as rp
from kvagent.bench.sources import load_episodes
from kvagent.bench.stream import build_stream
from kvagent.bench.study.design import budget_for
from kvagent.cli.settings import add_arguments
from kvagent.errors import KvagentError
from kvagent.options import split_list
from kvagent.runtime import CacheConfig, Engine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", default="bundled", help="bundled (the default) or FILE.jsonl")
    ap.add_argument("--ids", required=True, help="episode ids, comma-separated")
    add_arguments(ap, many=["policy"], policies="snapkv,nexus")
    ap.add_argument("--max-tokens", type=int, default=8000)
    ap.add_argument("--fraction", type=float, default=0.1)
    args = ap.parse_args()
    spec = f"{args.episodes}:ids={'|'.join(split_list(args.ids, 'ids'))}"
    try:  # before the model loads: a missing episode file is one line naming the build command
        episodes = load_episodes([spec])
    except KvagentError as e:
        raise SystemExit(str(e)) from None
    engine = Engine.load("smollm2", device="cpu")
    streams = [build_stream(e, engine.tokenizer, max_tokens=args.max_tokens) for e in episodes]
    print("| episode | tokens | turns | policy | K | prefill tokens, rebuild | with reuse | "
          "wall s, rebuild | with reuse | speed-up | same KL at every position |")  # fmt: skip
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---|")
    ratios = []
    pair = 0
    for stream in streams:
        ref = rp.reference_run(engine, stream, probe=False).reference
        k = budget_for(args.fraction, len(stream.ids))
        for policy in split_list(args.policies, "policies"):
            cfg = CacheConfig(policy=policy, budget=k, buffer=32, window=16, protect="sink", mode="reprefill")
            runs = {}
            for reuse in (False, True) if pair % 2 == 0 else (True, False):
                t0 = time.perf_counter()
                res = rp.policy_run(engine, stream, cfg, ref, probe=False, reuse_prefix=reuse)
                runs[reuse] = (time.perf_counter() - t0, res)
            pair += 1
            (w0, r0), (w1, r1) = runs[False], runs[True]
            ratios.append(w0 / w1)
            print(
                f"| {stream.name} | {len(stream.ids):,} | {stream.n_turns} | {policy} | {k} | "
                f"{r0.stats['prefill_tokens']:,} | {r1.stats['prefill_tokens']:,} | {w0:.1f} | {w1:.1f} | "
                f"**{w0 / w1:.2f}x** | {'yes' if r0.kl == r1.kl else 'NO'} |",
                flush=True,
            )
    print(
        f"\ngeometric mean speed-up {math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f}x over {len(ratios)} pairs"
    )


if __name__ == "__main__":
    main()
