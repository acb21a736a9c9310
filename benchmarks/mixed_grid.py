"""The load `kvagent eval --concurrency N` carries (issue #29), end to end, side by side in one run: N
sessions of different policies and both modes (one grid on one engine), each an episode of turns
(a prompt, then per turn a reply decoded token by token and the next observation prefilled),
batched (one engine with max_batch=N, one thread per session) against the same sessions run one
after another on a solo engine. Decode-only batching of one policy is not the figure users get.

    .venv/bin/python benchmarks/mixed_grid.py [--quick] [--n 8] [--budget 256] [--buffer 32]
        [--turns 3] [--reply 96] [--dtype float32] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from functools import partial
from pathlib import Path

import torch

from kvagent.cli.settings import add_arguments
from kvagent.runtime import CacheConfig, Engine

sys.path.insert(0, str(Path(__file__).parent))
from _threads import run_together  # noqa: E402

POLICIES = ("random", "snapkv", "h2o", "streaming", "pyramidkv", "nexus")


def grid(n: int, budget: int, buffer: int) -> list[CacheConfig]:
    """n settings cycling the policies, modes alternating (6 policies x 2 modes for n >= 12)."""
    out = []
    for i in range(n):
        policy = POLICIES[i % len(POLICIES)]
        mode = ("persistent", "reprefill")[(i + i // len(POLICIES)) % 2]
        out.append(
            CacheConfig(policy=policy, budget=budget, buffer=buffer, mode=mode, protect="sink", seed=i)
        )
    return out


def episode(i: int, vocab: int, turns: int, reply: int) -> dict:
    """Session i's token script: a 300-560-token prompt, then per turn `reply` decoded tokens and a
    64-160-token observation (random ids: the cost does not depend on what they say)."""
    g = torch.Generator().manual_seed(1000 + i)
    prompt = 300 + int(torch.randint(0, 261, (1,), generator=g))
    obs = [64 + int(torch.randint(0, 97, (1,), generator=g)) for _ in range(turns - 1)]
    ids = lambda k: torch.randint(0, max(2, vocab - 512), (k,), generator=g).tolist()  # noqa: E731
    return {"prompt": ids(prompt), "observations": [ids(k) for k in obs], "reply": reply}


def play(session, ep: dict) -> int:
    """The episode through one session; returns tokens decoded."""
    logits = session.append(ep["prompt"])
    decoded = 0
    for t in range(len(ep["observations"]) + 1):
        for _ in range(ep["reply"]):
            logits = session.step(int(torch.argmax(logits)))
            decoded += 1
        if t < len(ep["observations"]):
            logits = session.append(ep["observations"][t])
    return decoded


def sequential(engine, cfgs, eps) -> float:
    t0 = time.perf_counter()
    for c, ep in zip(cfgs, eps, strict=True):
        play(engine.session(c), ep)
    return time.perf_counter() - t0


def batched(engine, cfgs, eps) -> float:
    sessions = [engine.session(c) for c in cfgs]
    return run_together([partial(play, s, ep) for s, ep in zip(sessions, eps, strict=True)])


def composition(sched_mod):
    """Wraps the batcher's packed forward to record each forward's rows and time; returns
    (restore, summary): how much of the batched wall went to forwards holding a prefill chunk,
    to decode-only forwards (and their mean rows), and to neither (every session busy outside a
    forward: rounds, sampling, bookkeeping)."""
    real, log = sched_mod.run_packed, []

    def recorded(engine, chunks):
        t0 = time.perf_counter()
        try:
            return real(engine, chunks)
        finally:
            log.append((time.perf_counter() - t0, [len(c.ids) for c in chunks]))

    sched_mod.run_packed = recorded

    def restore():
        sched_mod.run_packed = real

    def summary(wall: float) -> dict:
        pre = [(t, r) for t, r in log if max(r) > 1]
        dec = [(t, r) for t, r in log if max(r) == 1]
        t_pre, t_dec = sum(t for t, _ in pre), sum(t for t, _ in dec)
        return {"forwards": len(log), "prefill_forwards": len(pre), "prefill_forward_s": t_pre,
                "decode_forward_s": t_dec, "outside_forward_s": max(0.0, wall - t_pre - t_dec),
                "decode_rows_mean": sum(len(r) for _, r in dec) / max(1, len(dec)),
                "decode_rows_in_prefill_forwards": sum(sum(x == 1 for x in r) for _, r in pre)}  # fmt: skip

    return restore, summary


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny random model (a smoke run)")
    add_arguments(ap, tokens=["budget"], one=["buffer"], engine=["model", "dtype"], dtype="float32", budget=256,
                  buffer=32)  # fmt: skip
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--reply", type=int, default=96)
    ap.add_argument("--batched-only", action="store_true", help="skip the one-after-another run")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if args.quick:
        args.model, args.reply, args.turns = "tiny-random-qwen3", 8, 2
    solo = Engine.load(args.model, device="cpu", dtype=args.dtype)
    many = Engine.load(solo.model, tokenizer=solo.tokenizer, device="cpu", dtype=args.dtype, max_batch=args.n)
    vocab = solo.model.config.vocab_size
    cfgs = grid(args.n, args.budget, args.buffer)
    eps = [episode(i, vocab, args.turns, args.reply) for i in range(args.n)]
    print(f"mixed grid: {args.model} {args.dtype}, {args.n} sessions "
          f"({', '.join(f'{c.policy}/{c.mode[0]}' for c in cfgs)}), K={args.budget} r={args.buffer}, "
          f"{args.turns} turns of {args.reply} decoded tokens, prompts "
          f"{min(len(e['prompt']) for e in eps)}-{max(len(e['prompt']) for e in eps)}; CPU threads "
          f"{torch.get_num_threads()}; {time.strftime('%Y-%m-%d %H:%M')}", flush=True)  # fmt: skip
    warm = grid(2, args.budget, args.buffer)
    sequential(solo, warm[:1], eps[:1])
    batched(many, warm, eps[:2])
    sched = many.batcher
    f0, r0 = sched.forwards, sched.rows
    t_seq = sequential(solo, cfgs, eps) if not args.batched_only else float("nan")
    from kvagent.runtime import batcher as sched_mod

    restore, summary = composition(sched_mod)
    try:
        t_bat = batched(many, cfgs, eps)
    finally:
        restore()
    comp = summary(t_bat)
    decoded = args.n * args.turns * args.reply
    row = {"sequential_s": t_seq, "batched_s": t_bat, "speedup": t_seq / t_bat,
           "decoded_tokens": decoded, "sequential_tok_s": decoded / t_seq, "batched_tok_s": decoded / t_bat,
           "mean_batch": (sched.rows - r0) / max(1, sched.forwards - f0), "batched_forwards": comp}  # fmt: skip
    print(f"one after another {t_seq:7.1f} s ({row['sequential_tok_s']:.1f} decoded tok/s)  batched "
          f"{t_bat:7.1f} s ({row['batched_tok_s']:.1f} tok/s)  x{row['speedup']:.2f}  mean batch "
          f"{row['mean_batch']:.1f}", flush=True)  # fmt: skip
    print(f"batched wall: {comp['prefill_forward_s'] / t_bat:.0%} in {comp['prefill_forwards']} forwards holding a "
          f"prefill chunk (with {comp['decode_rows_in_prefill_forwards']} decode rows in all), "
          f"{comp['decode_forward_s'] / t_bat:.0%} in {comp['forwards'] - comp['prefill_forwards']} decode-only "
          f"forwards (mean {comp['decode_rows_mean']:.1f} rows), {comp['outside_forward_s'] / t_bat:.0%} outside "
          "any forward", flush=True)  # fmt: skip
    many.close()
    result = {"settings": vars(args), "grid": [repr(c) for c in cfgs], **row}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
