"""Batched decode throughput, side by side in one run: N concurrent sessions on one engine with
`max_batch` (one thread each) against the same N sessions decoded one after another on a solo
engine, both with eviction running (every session holds K..K+r entries and fires its own rounds).
Also: a plain batched HF forward over dense caches of the same length (the ceiling of batching on
this machine), KV bytes per session, and how many sessions fit a memory budget, evicting vs dense.

    .venv/bin/python benchmarks/batch_throughput.py [--quick] [--ns 1,2,4,8,16] [--policy random]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from functools import partial
from pathlib import Path

import torch

from kvagent.cli.settings import add_arguments
from kvagent.options import split_list
from kvagent.runtime import CacheConfig, Engine

sys.path.insert(0, str(Path(__file__).parent))
from _threads import run_together  # noqa: E402


def _ids(gen: torch.Generator, n: int, vocab: int) -> list[int]:
    return torch.randint(0, max(2, vocab - 512), (n,), generator=gen).tolist()


def config(policy: str, budget: int | None, buffer: int, seed: int) -> CacheConfig:
    return CacheConfig(policy=policy, budget=budget, buffer=buffer, protect="sink", seed=seed)


def prefilled(engine, cfg: CacheConfig, prompt: int, seed: int):
    s = engine.session(cfg)
    s.append(_ids(torch.Generator().manual_seed(seed), prompt, engine.model.config.vocab_size))
    return s


def decode(session, steps: int) -> None:
    """Greedy steps that ignore EOS, so every session decodes exactly `steps` tokens."""
    logits = session.last_logits
    for _ in range(steps):
        logits = session.step(int(torch.argmax(logits)))


def sequential(engine, cfgs, prompt: int, steps: int) -> float:
    """Decode tokens/s of the sessions run one after another (prefill untimed)."""
    sessions = [prefilled(engine, c, prompt, c.seed) for c in cfgs]
    t0 = time.perf_counter()
    for s in sessions:
        decode(s, steps)
    return len(cfgs) * steps / (time.perf_counter() - t0)


def concurrent(engine, cfgs, prompt: int, steps: int) -> tuple[float, list]:
    """Decode tokens/s of the sessions run at once, one thread each (prefill untimed)."""
    sessions = [prefilled(engine, c, prompt, c.seed) for c in cfgs]
    elapsed = run_together([partial(decode, s, steps) for s in sessions])
    return len(cfgs) * steps / elapsed, sessions


def hf_ceiling(model, n: int, length: int, steps: int) -> float:
    """Decode tokens/s of a plain batched HF forward (SDPA, DynamicCache) over `length` tokens."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    ids = torch.randint(0, min(1000, model.config.vocab_size), (n, length))
    with torch.no_grad():
        out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        tok = out.logits[:, -1].argmax(-1, keepdim=True)
        t0 = time.perf_counter()
        for _ in range(steps):
            out = model(input_ids=tok, past_key_values=cache, use_cache=True, logits_to_keep=1)
            tok = out.logits[:, -1].argmax(-1, keepdim=True)
    return n * steps / (time.perf_counter() - t0)


def memory(solo, batch_engine, args, length: int) -> dict:
    """Peak KV bytes of one evicting session (its pool slot) and of one dense session at the
    episode's length; sessions that fit args.memory_gib of KV."""
    ev = prefilled(batch_engine, config(args.policy, args.budget, args.buffer, 0), args.prompt, 0)
    decode(ev, args.steps)
    dense = prefilled(solo, config("full", None, args.buffer, 0), length, 0)
    per_token = dense.stats.total_kv_bytes / dense.stats.max_entries  # capacity may exceed length
    budget = args.memory_gib * 2**30
    ev_bytes = ev.stats.total_kv_bytes
    out = {"evicting_bytes": ev_bytes, "dense_bytes_per_token": per_token, "budget_bytes": budget}
    out["evicting_fit"] = int(budget // ev_bytes)
    for n_tok in (length, 8192, 32768):
        out[f"dense_bytes@{n_tok}"] = per_token * n_tok
        out[f"dense_fit@{n_tok}"] = int(budget // (per_token * n_tok))
    return out


def run(args) -> dict:
    if args.quick:
        from kvagent.runtime.models import load_qwen3_tokenizer, tiny_random_model

        model = tiny_random_model("qwen3", vocab_size=512, seed=0)
        tok = load_qwen3_tokenizer()
    else:
        from kvagent.runtime.models import resolve

        model, tok = resolve(args.model, torch.float32)
    ref = copy.deepcopy(model).eval()  # stock SDPA attention for the ceiling
    solo = Engine.load(model, tokenizer=tok, device="cpu")
    batched = Engine.load(model, tokenizer=tok, device="cpu", max_batch=max(args.ns))
    # Warm the kernels of both paths once, so the first timed N does not pay for it.
    warm = [config(args.policy, args.budget, args.buffer, i) for i in range(2)]
    sequential(solo, warm[:1], args.prompt, 4)
    concurrent(batched, warm, args.prompt, 4)
    length = args.prompt + args.steps
    rows = []
    base_seq = base_hf = None
    for n in args.ns:
        cfgs = [config(args.policy, args.budget, args.buffer, 100 * n + i) for i in range(n)]
        seq = sequential(solo, cfgs, args.prompt, args.steps)
        f0, r0 = batched.batcher.forwards, batched.batcher.rows
        con, sessions = concurrent(batched, cfgs, args.prompt, args.steps)
        sched = batched.batcher
        hf = hf_ceiling(ref, n, args.budget + args.buffer // 2, args.hf_steps) if args.ceiling else None
        base_seq = base_seq or seq
        base_hf = base_hf or hf
        row = {
            "n": n,
            "sequential_tok_s": seq,
            "concurrent_tok_s": con,
            "speedup": con / seq,
            "vs_one_sequential": con / base_seq,
            "mean_batch": (sched.rows - r0) / max(1, sched.forwards - f0),
            "rounds_per_session": sum(s.stats.rounds for s in sessions) / n,
        }
        if hf is not None:
            row["hf_tok_s"] = hf
            row["hf_speedup"] = hf / base_hf
        rows.append(row)
        print(
            f"N={n:2d}  sequential {seq:7.1f} tok/s  concurrent {con:7.1f} tok/s  x{con / seq:4.2f}"
            f"  (mean batch {row['mean_batch']:.1f}, rounds/session {row['rounds_per_session']:.1f})"
            + (f"  | HF batched x{row['hf_speedup']:4.2f}" if hf is not None else ""),
            flush=True,
        )
    mem = memory(solo, batched, args, length)
    batched.close()
    return {"settings": {k: v for k, v in vars(args).items() if k != "json"}, "rows": rows, "memory": mem}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny random model, small K (a smoke run)")
    # K default 1024 (quick 32), r 128 (quick 8)
    add_arguments(ap, one=["policy", "buffer"], tokens=["budget"], engine=["model"], policy="random", budget=None,
                  buffer=None)  # fmt: skip
    ap.add_argument("--ns", default=None, help="session counts, e.g. 1,2,4,8,16")
    ap.add_argument("--steps", type=int, default=None, help="timed decode steps per session")
    ap.add_argument("--memory-gib", type=float, default=4.0, help="KV memory budget for the fit count")
    ap.add_argument("--no-ceiling", dest="ceiling", action="store_false", help="skip the HF batched ceiling")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    q = args.quick
    args.ns = (
        [int(x) for x in split_list(args.ns, "ns")] if args.ns else ([1, 2, 4] if q else [1, 2, 4, 8, 16])
    )
    args.budget = args.budget or (32 if q else 1024)
    args.buffer = args.buffer or (8 if q else 128)
    args.steps = args.steps or (2 * args.buffer)  # two rounds per session in the timed decode
    args.prompt = args.budget + args.buffer  # prefill ends on a round: the cache holds K entries
    args.hf_steps = 8 if q else 32
    print(
        f"batch throughput: {'tiny-random-qwen3' if q else args.model}, policy {args.policy}, "
        f"K={args.budget} r={args.buffer}, {args.steps} decode steps per session, "
        f"CPU threads {torch.get_num_threads()}; {time.strftime('%Y-%m-%d %H:%M')}",
        flush=True,
    )
    result = run(args)
    m = result["memory"]
    mib = 2**20
    print(
        f"KV per session: evicting {m['evicting_bytes'] / mib:.1f} MiB (slot, constant); dense "
        f"{m['dense_bytes_per_token'] / 1024:.1f} KiB/token = {m['dense_bytes@32768'] / mib:.0f} MiB at 32k tokens"
    )
    print(
        f"sessions fitting {args.memory_gib:g} GiB of KV: evicting {m['evicting_fit']}; dense "
        + ", ".join(f"{m[f'dense_fit@{n}']} at {n} tokens" for n in (args.prompt + args.steps, 8192, 32768))
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
