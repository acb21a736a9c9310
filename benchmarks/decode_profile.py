"""Where kvagent's decode step spends its time on this CPU (issue #29), side by side in one run:
per dtype, the solo step (Session.step) against a bare transformers forward over a DynamicCache
of the same length, the batched step (N sessions on one engine, one thread each), and a
torch.profiler breakdown of each by op family, plus the time outside any torch op (Python).

    .venv/bin/python benchmarks/decode_profile.py [--quick] [--dtypes float32,bfloat16] [--ns 1,8]
        [--length 1024] [--steps 32] [--policy random --budget 1024 --buffer 128] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections import defaultdict
from functools import partial
from pathlib import Path

import torch

from kvagent.cli.settings import add_arguments
from kvagent.options import split_list
from kvagent.runtime import CacheConfig, Engine

sys.path.insert(0, str(Path(__file__).parent))
from _threads import run_together  # noqa: E402

FAMILIES = (
    ("linear", ("addmm", "aten::mm", "aten::bmm", "linear", "matmul", "mkldnn")),
    ("attention", ("scaled_dot_product", "flash_attention", "_efficient_attention")),
    ("norm/act", ("rsqrt", "pow", "mean", "silu", "aten::mul", "aten::add", "aten::neg", "aten::div",
                  "aten::sigmoid", "aten::sub", "aten::exp")),
    ("copy/index", ("copy_", "index", "cat", "gather", "scatter", "slice", "select", "narrow", "to",
                    "clone", "contiguous", "expand", "repeat", "empty", "zeros", "ones", "arange", "fill_",
                    "view", "reshape", "transpose", "unsqueeze", "t", "as_strided", "stack", "masked",
                    "where", "tril", "unbind", "split", "chunk")),
)  # fmt: skip


def family(name: str) -> str:
    for fam, keys in FAMILIES:
        if any(k in name for k in keys):
            return fam
    return "other ops"


def breakdown(prof, wall_s: float) -> dict:
    """Share of the profiled wall time by op family (self time of the ops on the thread that ran
    the forwards) and outside any op (Python, the batcher's waits). Shares, not ms: the profiler
    itself slows every op down."""
    per = defaultdict(float)
    for e in prof.key_averages():
        if e.key.startswith("ProfilerStep") or e.key.startswith("## "):
            continue
        per[family(e.key)] += e.self_cpu_time_total / 1e6  # us -> s
    inside = sum(per.values())
    out = {k: v / wall_s for k, v in sorted(per.items(), key=lambda kv: -kv[1])}
    out["outside torch ops"] = max(0.0, wall_s - inside) / wall_s
    return out


def top_ops(prof, wall_s: float, k: int) -> list[tuple[str, float, int]]:
    """The k ops with the most self time: (name, share of the profiled wall, calls)."""
    rows = [(e.key, e.self_cpu_time_total / 1e6 / wall_s, e.count) for e in prof.key_averages()]
    return sorted(rows, key=lambda r: -r[1])[:k]


def _ids(n: int, vocab: int, seed: int) -> list[int]:
    return torch.randint(0, max(2, vocab - 512), (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def cfg(args, seed: int) -> CacheConfig:
    if args.policy == "full":
        return CacheConfig(policy="full", seed=seed)
    return CacheConfig(policy=args.policy, budget=args.budget, buffer=args.buffer, protect="sink", seed=seed)


def decode(session, steps: int) -> None:
    logits = session.last_logits
    for _ in range(steps):
        logits = session.step(int(torch.argmax(logits)))


def solo(engine, args, profile: bool) -> dict:
    s = engine.session(cfg(args, 0))
    s.append(_ids(args.length, engine.model.config.vocab_size, 0))
    decode(s, 4)
    t0 = time.perf_counter()
    decode(s, args.steps)
    wall = time.perf_counter() - t0
    out = {"ms_per_step": wall * 1e3 / args.steps, "rounds": s.stats.rounds}
    if profile:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            t0 = time.perf_counter()
            decode(s, args.steps)
            pw = time.perf_counter() - t0
        out["profile_share"] = breakdown(prof, pw)
        out["top_ops"] = top_ops(prof, pw, args.top)
    return out


def bare(model, args) -> dict:
    """model(...) with a DynamicCache over the same length: the floor without kvagent's cache."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    ids = torch.tensor([_ids(args.length, model.config.vocab_size, 0)])
    with torch.no_grad():
        out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        pos = args.length

        def steps(n):
            nonlocal out, pos
            for _ in range(n):
                tok = out.logits[:, -1].argmax(-1, keepdim=True)
                out = model(input_ids=tok, past_key_values=cache, use_cache=True, logits_to_keep=1,
                            position_ids=torch.tensor([[pos]]))  # fmt: skip
                pos += 1

        steps(4)
        t0 = time.perf_counter()
        steps(args.steps)
        wall = time.perf_counter() - t0
    return {"ms_per_step": wall * 1e3 / args.steps}


def batched(engine, n: int, args, profile: bool) -> dict:
    sessions = [engine.session(cfg(args, 10 + i)) for i in range(n)]
    for i, s in enumerate(sessions):
        s.append(_ids(args.length, engine.model.config.vocab_size, 10 + i))

    def run(steps: int) -> float:
        return run_together([partial(decode, s, steps) for s in sessions])

    run(4)
    sched = engine.batcher
    f0, r0 = sched.forwards, sched.rows
    wall = run(args.steps)
    forwards = sched.forwards - f0
    out = {"tok_s": n * args.steps / wall, "ms_per_batch_step": wall * 1e3 / args.steps,
           "mean_batch": (sched.rows - r0) / max(1, forwards)}  # fmt: skip
    if profile:
        # the forwards run on the batcher's thread: profile there (its own profiler) around the loop
        from kvagent.runtime import batcher as sched_mod

        real = sched_mod.run_forward
        box: dict = {"prof": None, "t": 0.0}

        def profiled(eng, chunks):
            if box["prof"] is None:
                box["prof"] = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
                box["prof"].__enter__()
            t0 = time.perf_counter()
            try:
                return real(eng, chunks)
            finally:
                box["t"] += time.perf_counter() - t0

        sched_mod.run_forward = profiled
        f0 = sched.forwards
        try:
            pw = run(args.steps)
        finally:
            sched_mod.run_forward = real
        # one more forward so the profiler exits on the batcher thread
        done = threading.Event()

        def close(eng, chunks):
            box["prof"].__exit__(None, None, None)
            done.set()
            return real(eng, chunks)

        sched_mod.run_forward = close
        try:
            decode(sessions[0], 1)
        finally:
            sched_mod.run_forward = real
        done.wait(60)
        out["forward_share_of_wall"] = box["t"] / pw
        out["profile_share"] = breakdown(box["prof"], box["t"])
        out["top_ops"] = top_ops(box["prof"], box["t"], args.top)
        out["forwards"] = sched.forwards - f0 - 1
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny random model (a smoke run)")
    add_arguments(
        ap, one=["policy", "buffer"], tokens=["budget"], engine=["model"], policy="random", budget=1024
    )
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--ns", default="1,8", help="batched session counts (1 = solo only)")
    ap.add_argument("--length", type=int, default=1024, help="tokens prefilled before decoding")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--no-profile", dest="profile", action="store_false")
    ap.add_argument("--top", type=int, default=12, help="ops listed by self time")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if args.quick:
        args.model, args.length, args.budget, args.buffer, args.steps = "tiny-random-qwen3", 64, 32, 8, 8
    ns = [int(x) for x in split_list(args.ns, "ns")]
    print(f"decode profile: {args.model}, L={args.length}, {args.steps} steps, policy {args.policy} "
          f"K={args.budget} r={args.buffer}, CPU threads {torch.get_num_threads()}; "
          f"{time.strftime('%Y-%m-%d %H:%M')}", flush=True)  # fmt: skip
    result = {"settings": vars(args), "dtypes": {}}
    for dt in split_list(args.dtypes, "dtypes"):
        engine = Engine.load(args.model, device="cpu", dtype=dt)
        row = {"solo": solo(engine, args, args.profile), "bare_hf": bare(engine.model, args)}
        row["solo_vs_bare"] = row["solo"]["ms_per_step"] / row["bare_hf"]["ms_per_step"]
        for n in (n for n in ns if n > 1):
            eng = Engine.load(engine.model, tokenizer=engine.tokenizer, device="cpu", dtype=dt, max_batch=n)
            row[f"batched_{n}"] = batched(eng, n, args, args.profile)
            eng.close()
        result["dtypes"][dt] = row
        print(f"\n== {dt}: solo {row['solo']['ms_per_step']:.1f} ms/step, bare HF "
              f"{row['bare_hf']['ms_per_step']:.1f} ms/step (x{row['solo_vs_bare']:.2f})", flush=True)  # fmt: skip
        for k, v in row["solo"].get("profile_share", {}).items():
            print(f"   solo  {k:18s} {v:6.1%}")
        for name, share, calls in row["solo"].get("top_ops", []):
            print(f"   solo    {name[:44]:44s} {share:6.1%}  {calls / args.steps:6.0f} calls/step")
        for n in (n for n in ns if n > 1):
            b = row[f"batched_{n}"]
            print(f"   N={n}: {b['tok_s']:.1f} tok/s, {b['ms_per_batch_step']:.1f} ms per batch step, mean batch "
                  f"{b['mean_batch']:.1f}, forward {b.get('forward_share_of_wall', 0):.0%} of wall")  # fmt: skip
            for k, v in b.get("profile_share", {}).items():
                print(f"   N={n}  {k:18s} {v:6.1%} of the forwards")
            for name, share, calls in b.get("top_ops", []):
                print(
                    f"   N={n}    {name[:44]:44s} {share:6.1%}  {calls / max(1, b['forwards']):6.0f} calls/forward"
                )
        del engine
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
