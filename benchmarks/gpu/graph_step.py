"""The static, captured decode step at DeepSWE-Preview's shape, in one command that ends by itself.

    python benchmarks/gpu/graph_step.py --out gpu-step                  # CUDA, 6 minutes at most
    python benchmarks/gpu/graph_step.py --quick --device cpu --out tmp   # tiny shapes (the test)

1. bandwidth: the device's measured copy bandwidth (a large device-to-device copy: bytes read +
   written per second) and the bound it puts on one decode step: the weights read once;
2. steps: N = 1, 8, 32 sessions (random and nexus, K = 8192, r = 128, staggered so eviction
   rounds fire inside the timed steps) decoding together on one engine, the eager forward against
   the static step (`graph` on CUDA: one CUDA graph per batch size; `static` on a CPU), the same
   sessions under both: step ms, tokens/s, the step over the bound, tokens/s over N = 1's, the
   rounds' share of the decode time;
3. profile: torch.profiler over a few steps at N = 8 in each mode: device kernels a step, the
   costliest ops.

Model depth: all 64 layers when weights and N_max sessions fit in 85% of the device, else the most
that do (recorded; the bound is for the layers built). Writes OUT/graph_step.json and
OUT/graph_step.md after every part. Runs from the repository root without installing kvagent.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for p in (str(HERE), str(ROOT)):  # the repository's kvagent, never an installed copy
    if p in sys.path:
        sys.path.remove(p)
    sys.path.insert(0, p)

import gpu_shapes  # noqa: E402
import torch  # noqa: E402
from gpu_clock import Clock  # noqa: E402

from kvagent.fileio import atomic_write_json, atomic_write_text  # noqa: E402
from kvagent.runtime import CacheConfig, Engine  # noqa: E402

FULL = dict(budget=8192, buffer=128, ns=(1, 8, 32), steps=24, warm=3, policies=("random", "nexus"))
QUICK = dict(budget=64, buffer=32, ns=(1, 2, 4), steps=12, warm=2, policies=("random", "nexus"))
CAPS = {"build": 60.0, "bandwidth": 15.0, "steps": 240.0, "profile": 30.0}  # seconds, 345 in all


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bandwidth(device: torch.device, quick: bool) -> dict:
    """Copy a large buffer a few times; GB/s counts bytes read plus bytes written."""
    n = (64 << 20) if quick or device.type != "cuda" else (2 << 30)
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync(device)
    reps, t0 = 5, time.perf_counter()
    for _ in range(reps):
        dst.copy_(src)
    sync(device)
    wall = time.perf_counter() - t0
    del src, dst
    return {"bytes": n, "gb_s": 2 * n * reps / wall / 1e9}


def fill(engine, sessions: list, plan: dict) -> float:
    """Prefill each session to one entry short of K + 2r minus a stagger, so rounds fall at
    different steps of the timed window (every session rounds once per r tokens)."""
    k, r = plan["budget"], plan["buffer"]
    vocab = int(engine.model.config.vocab_size)
    t0 = time.perf_counter()
    for i, s in enumerate(sessions):
        gen = torch.Generator().manual_seed(100 + i)
        n = k + 2 * r - 1 - (i * 5) % r
        s.append(torch.randint(0, vocab - 1, (n,), generator=gen).tolist())
    sync(engine.device)
    return time.perf_counter() - t0


def together(engine, sessions: list, steps: int) -> float:
    """Every session steps `steps` greedy-free tokens (fixed ids) at once, one thread each; the
    decode wall, device synchronised at both ends."""
    go = threading.Barrier(len(sessions) + 1)
    done = threading.Barrier(len(sessions) + 1)
    errors: list[str] = []

    def drive(i: int, s) -> None:
        try:
            go.wait()
            for t in range(steps):
                s.step((7 * i + 13 * t) % 500 + 1)
            done.wait()
        except Exception as e:  # one failing session must not hang the others at a barrier
            errors.append(f"session {i}: {type(e).__name__}: {e}")
            go.abort()
            done.abort()

    threads = [threading.Thread(target=drive, args=(i, s), daemon=True) for i, s in enumerate(sessions)]
    for t in threads:
        t.start()
    try:
        sync(engine.device)
        go.wait()
        t0 = time.perf_counter()
        done.wait()
        sync(engine.device)
        return time.perf_counter() - t0
    except threading.BrokenBarrierError:
        raise RuntimeError("; ".join(errors) or "a barrier broke") from None
    finally:
        for t in threads:
            t.join(timeout=30)


def round_seconds(sessions) -> float:
    return sum(s.stats.scoring_s + s.stats.compaction_s for s in sessions)


def step_rows(engine, policy: str, plan: dict, modes: list[str], clock, report: dict, save) -> None:
    n_max = max(plan["ns"])
    cfg = CacheConfig(policy=policy, budget=plan["budget"], buffer=plan["buffer"], protect="sink")
    sessions = [engine.session(cfg) for _ in range(n_max)]
    report["prefill_s"][policy] = fill(engine, sessions, plan)
    base: dict[str, float] = {}
    for n in plan["ns"]:
        for mode in modes:
            if not clock.allows("steps"):
                report["skipped"].append(f"{policy} N={n} {mode}: time")
                continue
            t0 = time.perf_counter()
            engine.set_decode_step(mode)
            group = sessions[:n]
            try:
                together(engine, group, plan["warm"])  # capture / first use outside the timing
                rounds0 = round_seconds(group)
                wall = together(engine, group, plan["steps"])
            except torch.OutOfMemoryError:
                raise  # the caller records it and frees the cache
            except Exception as e:  # a mode that fails (first capture on a new card) must not end the run
                report["skipped"].append(
                    f"{policy} N={n} {mode}: {type(e).__name__}: {str(e).splitlines()[0][:300]}"
                )
                clock.tick("steps", time.perf_counter() - t0)
                save()
                continue
            rounds = round_seconds(group) - rounds0
            tok_s = n * plan["steps"] / wall
            if n == plan["ns"][0]:
                base[mode] = tok_s
            step_ms = 1000 * wall / plan["steps"]
            report["steps"].append(
                {
                    "policy": policy,
                    "n": n,
                    "mode": mode,
                    "step_ms": step_ms,
                    "tokens_s": tok_s,
                    "vs_bound": step_ms / (1000 * report["bound_s"]) if report.get("bound_s") else None,
                    "vs_n1": tok_s / base[mode] if mode in base else None,
                    "round_share": rounds / wall,
                    "static_steps": engine.step_runner.steps,
                }
            )
            clock.tick("steps", time.perf_counter() - t0)
            save()
    del sessions


def profile(engine, plan: dict, modes: list[str], report: dict) -> None:
    n = min(8, max(plan["ns"]))
    cfg = CacheConfig(policy="random", budget=plan["budget"], buffer=plan["buffer"], protect="sink")
    sessions = [engine.session(cfg) for _ in range(n)]
    fill(engine, sessions, plan)
    acts = [torch.profiler.ProfilerActivity.CPU]
    if engine.device.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    for mode in modes:
        engine.set_decode_step(mode)
        together(engine, sessions, plan["warm"])
        steps = 4
        # The forwards run on the scheduler's thread, which a default profile does not see.
        every_thread = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
        with torch.profiler.profile(activities=acts, experimental_config=every_thread) as prof:
            together(engine, sessions, steps)
        events = prof.key_averages()
        device_kernels = sum(
            e.count for e in events if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA
        )
        launches = sum(e.count for e in events if e.key in ("cudaLaunchKernel", "cudaGraphLaunch"))
        top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:8]
        report["profile"].append(
            {
                "mode": mode,
                "n": n,
                "aten_ops_per_step": sum(e.count for e in events if e.key.startswith("aten::")) / steps,
                "device_kernels_per_step": device_kernels / steps,
                "launches_per_step": launches / steps,
                "top_cpu": [(e.key, e.self_cpu_time_total / steps / 1000) for e in top],
            }
        )
    del sessions


def markdown(report: dict) -> str:
    lines = [
        "# Static decode step: eager vs static / captured",
        "",
        f"{report['device']}, {report['dtype']}, {report['layers']} of {report['full_layers']} layers, "
        f"K={report['plan']['budget']}, r={report['plan']['buffer']}",
        "",
    ]
    if report.get("bandwidth"):
        bw = report["bandwidth"]
        lines += [
            f"Copy bandwidth {bw['gb_s']:.0f} GB/s; weights {report['weights_bytes'] / 1e9:.2f} GB; "
            f"bound {1000 * report['bound_s']:.2f} ms a step.",
            "",
        ]
    if report["steps"]:
        lines += [
            "| policy | N | mode | step ms | tokens/s | step / bound | tokens/s / N=1's | rounds' share |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in report["steps"]:
            vb = f"{r['vs_bound']:.2f}" if r["vs_bound"] else "-"
            v1 = f"{r['vs_n1']:.2f}" if r["vs_n1"] else "-"
            lines.append(
                f"| {r['policy']} | {r['n']} | {r['mode']} | {r['step_ms']:.1f} | {r['tokens_s']:.1f} | "
                f"{vb} | {v1} | {100 * r['round_share']:.2f}% |"
            )
        lines.append("")
    for p in report["profile"]:
        lines.append(
            f"- profile {p['mode']} N={p['n']}: {p['aten_ops_per_step']:.0f} aten ops, "
            f"{p['device_kernels_per_step']:.0f} device kernels, {p['launches_per_step']:.0f} launches a step"
        )
    if report["skipped"]:
        lines += ["", "Skipped: " + "; ".join(report["skipped"])]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="tiny shapes: the same code in seconds")
    ap.add_argument(
        "--modes", default=None, help="comma list (default: eager,graph on CUDA; eager,static on a CPU)"
    )
    ap.add_argument("--total-s", type=float, default=sum(CAPS.values()))
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("graph_step: no CUDA device; use --device cpu (with --quick)", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plan = dict(QUICK if args.quick else FULL)
    shape = gpu_shapes.QWEN3_QUICK if args.quick else gpu_shapes.QWEN3_32B
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    modes = (args.modes or ("eager,graph" if device.type == "cuda" else "eager,static")).split(",")
    clock = Clock(args.total_s, CAPS)
    report = {
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or "cpu",
        "dtype": str(dtype).removeprefix("torch."),
        "torch": torch.__version__,
        "plan": {k: list(v) if isinstance(v, tuple) else v for k, v in plan.items()},
        "full_layers": shape["num_hidden_layers"],
        "steps": [],
        "profile": [],
        "skipped": [],
        "prefill_s": {},
        "threads": torch.get_num_threads(),
        "pid": os.getpid(),
    }

    def save() -> None:
        atomic_write_json(out / "graph_step.json", report)
        atomic_write_text(out / "graph_step.md", markdown(report))

    layers = shape["num_hidden_layers"]
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        kv = gpu_shapes.kv_bytes_per_token(shape, 1, dtype) * (plan["budget"] + 2 * plan["buffer"] + 1)
        per_layer = gpu_shapes.layers_that_fit(shape, dtype, total, 0)  # weights only
        layers = min(per_layer, layers)
        while layers > 1 and _bytes(shape, layers, dtype) + max(plan["ns"]) * kv * layers > 0.85 * total:
            layers -= 1
    model, build_s = gpu_shapes.build_qwen3(shape, layers, device, dtype)
    report.update(layers=layers, build_s=build_s, weights_bytes=gpu_shapes.param_bytes(model))
    engine = Engine.load(
        model, tokenizer=gpu_shapes.NoTokenizer(), device=device, dtype=dtype, max_batch=max(plan["ns"])
    )
    report["bandwidth"] = bandwidth(device, args.quick)
    report["bound_s"] = report["weights_bytes"] / (report["bandwidth"]["gb_s"] * 1e9)
    save()
    for policy in plan["policies"]:
        try:
            step_rows(engine, policy, plan, modes, clock, report, save)
        except torch.OutOfMemoryError as e:
            report["skipped"].append(f"{policy}: out of memory: {str(e).splitlines()[0]}")
            torch.cuda.empty_cache()
        save()
    if clock.allows("profile", 1.0):
        profile(engine, plan, modes, report)
    save()
    engine.close()
    print(markdown(report))
    return 0


def _bytes(shape: dict, layers: int, dtype: torch.dtype) -> int:
    elem = torch.empty((), dtype=dtype).element_size()
    h, inter, v = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"]
    q = shape["num_attention_heads"] * shape["head_dim"]
    kv = shape["num_key_value_heads"] * shape["head_dim"]
    return elem * (layers * (2 * h * q + 2 * h * kv + 3 * h * inter) + 2 * v * h)


if __name__ == "__main__":
    sys.exit(main())
