"""The decode step's modes side by side in one process (runtime/step.py): `eager` (the transformers
forward), `static` (the static step run op by op) and `compiled` (the static step under
torch.compile), each on its own copy of the model, blocks of steps alternating between them so
load from other jobs hits all alike. Reports each mode's median step time, the ratio to eager
(the median of the block-set ratios), the compile time and the break-even: how many decode tokens
the compiled step must run before its compile time is paid back. `parts` is the static step with
only RMSNorm, RoPE and the gated activation compiled (`Decoder.compile_parts`, as the CUDA graph
mode has them). A mode followed by `+plain` or `+packed` (`eager+plain`, `static+packed`) runs
with that `linear=` (runtime/linear.py: plain is torch's F.linear, packed every weight over
oneDNN's packed layout, bfloat16 too where the CPU can); then `:split` or `:sdpa` picks the static
step's attention backend (runtime/attention_step.py: `static:split`, `static+packed:sdpa`); ratios
are to the first mode listed.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/decode_modes.py [--model smollm2] [--blocks 12]
        [--batched 8] [--dtype bfloat16] [--modes eager,static,parts,compiled] [--threads 1]
        [--budget 256] [--buffer 32] [--length 512]

Solo (default): one session per mode (random, K = `--budget` 256, r = `--buffer` 32, sink;
rounds fire inside the blocks), the calling thread's CPU time. `--batched N`: each mode a
batching engine with N sessions stepping at once (one thread each), the process's CPU time per
batch step.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode_ab import block_times  # noqa: E402

from kvagent.cli.settings import add_arguments  # noqa: E402
from kvagent.runtime import CacheConfig, Engine  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # the sessions' policy is random
    add_arguments(ap, tokens=["budget"], one=["buffer"], engine=["model", "dtype"], dtype="float32", budget=256,
                  buffer=32)  # fmt: skip
    ap.add_argument("--length", type=int, default=512, help="tokens prefilled before timing")
    ap.add_argument("--steps", type=int, default=16, help="decode steps per timed block")
    ap.add_argument("--blocks", type=int, default=12, help="timed blocks per mode")
    ap.add_argument("--batched", type=int, default=0, help="N > 1: N sessions per mode on a batching engine")
    ap.add_argument("--modes", default="eager,static,compiled", help="the first is the ratios' base")
    ap.add_argument(
        "--threads", type=int, default=1, help="torch threads (1: the steadiest on a shared machine)"
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    modes = args.modes.split(",")
    n = max(1, args.batched)
    loaded = Engine.load(args.model, device="cpu", dtype=args.dtype)
    vocab = int(loaded.model.config.vocab_size)
    gen = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(0, vocab - 512, (args.length + 7 * i,), generator=gen).tolist() for i in range(n)
    ]
    toks = [
        torch.randint(0, vocab - 512, (args.steps * (args.blocks + 2),), generator=gen).tolist()
        for _ in range(n)
    ]
    per_mode, compile_s = {}, None
    for mode in modes:
        mode_linear, _, attention = mode.partition(":")
        step, _, linear = mode_linear.partition("+")
        engine = Engine.load(
            copy.deepcopy(loaded.model), tokenizer=loaded.tokenizer, device="cpu", dtype=args.dtype,
            max_batch=n, decode_step="static" if step == "parts" else step, linear=linear or "auto",
        )  # fmt: skip
        if attention:  # the static step's attention backend (attention_step.py), made again with it
            engine.set_step_attention(attention)
            engine.set_decode_step(engine.step_runner.mode)
        if mode == "parts":
            engine.step_runner.decoder.compile_parts()
        sessions = []
        for i in range(n):
            s = engine.session(
                CacheConfig(policy="random", budget=args.budget, buffer=args.buffer, protect="sink", seed=i)
            )
            s.append(prompts[i])
            sessions.append(s)
        t0 = time.perf_counter()
        block_times(sessions, [t[: args.steps] for t in toks], args.steps)  # warm-up (and compile)
        if mode in ("compiled", "parts"):
            compile_s = {**(compile_s or {}), mode: time.perf_counter() - t0}
        per_mode[mode] = (engine, sessions)
    times = {m: ([], []) for m in modes}
    for b in range(1, args.blocks + 1):
        block = [t[(b + 1) * args.steps : (b + 2) * args.steps] for t in toks]
        order = modes if b % 2 else modes[::-1]
        for mode in order:
            cpu, wall = block_times(per_mode[mode][1], block, args.steps)
            times[mode][0].append(cpu)
            times[mode][1].append(wall)
    shape = f"batched N={n}, ms per batch step" if n > 1 else "solo"
    print(
        f"model {args.model} {args.dtype}, {shape}, L={args.length}, {args.blocks} alternating blocks x "
        f"{args.steps} steps, load {os.getloadavg()[0]:.1f}, CPU: {cpu_name()}"
    )
    for i, clock in enumerate(("cpu", "wall")):
        print(f"{clock + ' ms/step':<16}{'median':>10}{'/ ' + modes[0]:>16}")
        for mode in modes:
            med = statistics.median(times[mode][i])
            ratio = statistics.median(a / e for a, e in zip(times[mode][i], times[modes[0]][i], strict=True))
            print(f"{mode:<16}{med:>10.2f}{ratio:>16.3f}")
    for mode, seconds in (compile_s or {}).items():
        base = "static" if mode == "parts" and "static" in times else "eager"
        if base not in times:
            continue
        saved = statistics.median(times[base][1]) - statistics.median(times[mode][1])
        steps = seconds / (saved / 1000) if saved > 0 else float("inf")
        print(
            f"{mode}: compile + first block {seconds:.1f} s; break-even against {base} after "
            f"{steps:,.0f} decode steps ({n} a step)"
        )
    for engine, _ in per_mode.values():
        engine.close()


def cpu_name() -> str:
    flags = Path("/proc/cpuinfo").read_text() if os.path.exists("/proc/cpuinfo") else ""
    units = [f for f in ("avx512_bf16", "amx_bf16", "avx512f", "avx2") if f in flags]
    model = next((line.split(":", 1)[1].strip() for line in flags.splitlines() if "model name" in line), "?")
    return f"{model} ({', '.join(units) or 'no avx'})"


if __name__ == "__main__":
    main()
