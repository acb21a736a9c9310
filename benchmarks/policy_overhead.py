"""Eviction-round cost per policy, split into scoring and compaction, as a share of decode time, in
one run: ~100M Qwen3-shaped random model, K=2048, r=128, scope prefill+decode (a round every 128
decode steps). Goals: random <= 1%, nexus and the second-wave policies (tova, knorm, keydiff,
rkv, triattention) <= 3%, none > 5%. The segment-aware policy runs with a mark every 64 tokens.

    .venv/bin/python benchmarks/policy_overhead.py [--quick] [--device cuda] [--policies a,b]
        [--head-budget uniform,adaptive]   (Ada-KV head budgets, side by side in one run; policies
                                            that refuse adaptive budgets are skipped)
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import _model  # noqa: E402

from kvagent.bench.speed.run import decode_latency  # noqa: E402
from kvagent.cli.settings import add_arguments  # noqa: E402
from kvagent.errors import ConfigError  # noqa: E402
from kvagent.options import split_list  # noqa: E402
from kvagent.runtime import Engine  # noqa: E402

POLICIES = (
    "streaming", "random", "snapkv", "h2o", "pyramidkv", "nexus",
    "tova", "knorm", "keydiff", "rkv", "triattention", "morphkv", "vase", "segments",
)  # fmt: skip
SEGMENT = 64  # segments: a mark every 64 tokens (short agent turns: more segments, more to group)
GOALS = {
    "random": 0.01,
    "nexus": 0.03,
    **dict.fromkeys(("tova", "knorm", "keydiff", "rkv", "triattention"), 0.03),
}


def policy_args(policy: str, head_budget: str = "uniform") -> dict:
    # TriAttention's RoPE frequencies come from the engine (Engine.model_facts), not from here.
    if policy == "tova" and head_budget == "adaptive":
        return {"shared": False}  # adaptive head budgets need one keep-set per head
    return {}


def marked(session, length: int):
    """The session with a segment mark every SEGMENT positions up to `length` (an agent marks its
    replies and tool outputs; only the segment-aware policy reads them)."""
    for p in range(SEGMENT, length, SEGMENT):
        session.mark_segment(p)
    return session


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small model, K=512 (a smoke run)")
    add_arguments(
        ap, many=["policy", "head_budget"], engine=["device"], device="cpu", policies=",".join(POLICIES)
    )
    args = ap.parse_args()
    budgets = split_list(args.head_budget, "head-budget")
    model = _model.build(args.quick)
    engine = Engine.load(model, tokenizer=_model.tokenizer(), device=args.device)
    plain = engine.session
    k, r = (512, 128) if args.quick else (2048, 128)
    steps = 4 * r  # four rounds per policy
    print(
        f"model: Qwen3-shaped random, {_model.n_params(model) / 1e6:.0f}M params on {engine.device} "
        f"({engine.dtype}); K={k}, r={r}, head budgets {', '.join(budgets)}, {steps} decode steps from a "
        f"full cache; {time.strftime('%Y-%m-%d %H:%M')}"
    )
    print(f"{'policy':<22} {'rounds':>6} {'step ms':>8} {'scoring':>8} {'compact':>8} {'total':>8}  goal")
    for p, hb in itertools.product(args.policies.split(","), budgets):
        # decode_latency builds its own CacheConfig: give each of its sessions this head budget.
        engine.session = lambda cfg, hb=hb: marked(
            plain(dataclasses.replace(cfg, head_budget=hb)), k + 2 * r + steps
        )
        name = p if len(budgets) == 1 else f"{p} ({hb})"
        # Start just below K + r so every round in the timed window is a decode-time round.
        # k + 2r - 1: the prefill already runs one round (first calls of a policy's kernels are
        # slow), and the cache then sits one token short of K + r, as in the timed steady state.
        try:
            (row,) = decode_latency(engine, p, [k + 2 * r - 1], k, r, steps, policy_args=policy_args(p, hb))
        except ConfigError as e:
            print(f"{name:<22} skipped: {e}", flush=True)
            continue
        goal = GOALS.get(p, 0.05)
        ok = "ok" if row["round_share"] <= goal else "OVER"
        print(
            f"{name:<22} {row['rounds']:>6} {row['step_ms']:>8.2f} {row['scoring_share']:>8.2%} "
            f"{row['compaction_share']:>8.2%} {row['round_share']:>8.2%}  <= {goal:.0%} {ok}",
            flush=True,
        )


if __name__ == "__main__":
    main()
