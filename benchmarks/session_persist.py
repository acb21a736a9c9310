"""Moving a session out of memory and back (issue #48) against re-prefilling its history: time and
bytes per K on SmolLM2, and the same arithmetic at Qwen3-32B's shape.

A persistent session (snapkv, r = 128, protect=sink) is fed --history tokens, so its cache holds
what a round leaves plus decode (K + r to K + 2r entries a head). Measured per K: the state's
bytes, the host swap (`export_session(...).to_host()`) and its way back (`import_session`), a file
save (`Session.save`, atomic, fsynced) and load (`Engine.load_session`), and a fresh session
prefilling the same history (what `kvagent serve` did with a dropped session, and a different
protocol besides; timed once, as the session is fed). The moves are the median of --repeats.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/session_persist.py [--budgets 256,512,1024,2048]
        [--history 3072] [--repeats 3] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from kvagent.cli.settings import add_arguments
from kvagent.options import parse_budgets
from kvagent.runtime import CacheConfig, Engine, persist

QWEN3_32B = dict(layers=64, kv_heads=8, head_dim=128, q_heads=64, vocab=151_936, item=2)  # bf16


def timed(fn, repeats: int) -> tuple[float, object]:
    out, times = None, []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def qwen3_32b_bytes(k: int, r: int = 128, window: int = 16) -> int:
    """A Qwen3-32B session's state at its largest (K + 2r entries a head): keys + values (bf16) and
    int64 positions per layer and KV head, the window queries, the float32 last logits."""
    s = QWEN3_32B
    per_entry = s["kv_heads"] * (2 * s["head_dim"] * s["item"] + 8)
    window_q = s["q_heads"] * window * s["head_dim"] * s["item"]
    return s["layers"] * ((k + 2 * r) * per_entry + window_q) + 4 * s["vocab"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(ap, many=["budget"], budgets="256,512,1024,2048")
    ap.add_argument("--history", type=int, default=3072)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where the session files go")
    args = ap.parse_args()
    engine = Engine.load("smollm2", device="cpu", dtype="float32")
    g = torch.Generator().manual_seed(0)
    history = torch.randint(0, len(engine.tokenizer), (args.history,), generator=g).tolist()
    print(f"SmolLM2-135M, float32, CPU ({torch.get_num_threads()} threads), history {args.history} tokens\n")
    print("| K | entries / head | state MiB | to host ms | from host ms | save ms | load ms | file MiB | "
          "re-prefill ms | re-prefill / load |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for k in parse_budgets(args.budgets):
        cfg = CacheConfig(policy="snapkv", budget=k, buffer=128, protect="sink")
        t0 = time.perf_counter()
        session = engine.session(cfg)
        session.append(history[:-64])
        for t in history[-64:]:  # decode the last tokens, so the window and rounds are decode's
            session.step(t)
        # what re-prefilling the history costs (serve's fallback for a dropped session): the same
        # feed into a fresh session (a chunked prefill with its rounds; the last 64 tokens as steps)
        prefill_s = time.perf_counter() - t0
        out_s, state = timed(lambda s=session: persist.export_session(s).to_host(), args.repeats)
        in_s, _ = timed(lambda st=state: persist.import_session(engine, st), args.repeats)
        path = Path(args.dir) / f"session_persist_K{k}.kvs"
        save_s, size = timed(lambda s=session, p=path: s.save(p), args.repeats)
        load_s, loaded = timed(lambda p=path: engine.load_session(p), args.repeats)
        assert torch.equal(loaded.step(1), session.step(1)), "the loaded session must continue exactly"
        os.unlink(path)
        print(f"| {k} | {max(session.stats.entries)} | {state.nbytes / 2**20:.2f} | {out_s * 1e3:.1f} | "
              f"{in_s * 1e3:.1f} | {save_s * 1e3:.1f} | {load_s * 1e3:.1f} | {size / 2**20:.2f} | "
              f"{prefill_s * 1e3:.0f} | {prefill_s / load_s:.0f}x |")  # fmt: skip
    print("\nQwen3-32B's shape (64 layers, 8 KV heads of 128, bf16), arithmetic at K + 2r entries a head:\n")
    print("| K | state GiB | host copy at 25 GB/s (PCIe 5 pinned) ms | disk at 3 GB/s (NVMe) s |")
    print("|---:|---:|---:|---:|")
    for k in (2048, 4096, 8192, 16384):
        b = qwen3_32b_bytes(k)
        print(f"| {k} | {b / 2**30:.2f} | {b / 25e9 * 1e3:.0f} | {b / 3e9:.2f} |")


if __name__ == "__main__":
    main()
