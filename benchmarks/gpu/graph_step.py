"""The static, captured decode step at DeepSWE-Preview's shape, in one command that ends by itself.

    python benchmarks/gpu/graph_step.py --out gpu-step                  # CUDA, about 6 minutes
    python benchmarks/gpu/graph_step.py --quick --device cpu --out tmp   # tiny shapes (the test)

1. bandwidth: the device's copy bandwidth (bytes read + written per second) and the bound it puts on
   one decode step: the weights a step reads once (the input embedding is not read: one row a token);
2. steps: N = 1, 8, 32 sessions (random and nexus, K = 8192, r = 128, staggered so rounds fire
   inside the timed steps) decoding together on one engine, eager against the static step (`graph`
   on CUDA, `static` on a CPU) for each static attention backend (attention_step.py): per-forward
   timings (median and p90 of the forwards that held all N rows), tokens/s, the step over the
   bound, tokens/s over N = 1's, forwards and their mean batch, static steps, rounds and their
   event-timed seconds, and an exactness check per N (the static step's logits, `rewind(1)`, the
   eager step's: max |d logit| / max |logit| and argmax agreement);
3. profile: torch.profiler over a few steps at the smallest and the largest N, device time per
   kernel, attention's share (a profiler range around the uncaptured step's attention);
4. memory and versions: max_memory_allocated, mem_get_info, captures and their seconds, the
   compile seconds, torch / CUDA / driver.

All 64 layers when weights and N_max sessions fit in 90% of the device, else the most that do
(recorded; `--layers` sets it). Writes OUT/graph_step.json and OUT/graph_step.md after every unit;
a unit that fails is recorded with its whole traceback and the run goes on; a watchdog writes the
report and exits when `--total-s` (plus a margin) has passed, whatever hangs. Runs from the
repository root without installing kvagent.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import traceback
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
from kvagent.runtime import batcher as batcher_module  # noqa: E402

FULL = dict(budget=8192, buffer=128, ns=(1, 8, 32), steps=24, warm=3, policies=("random", "nexus"))
QUICK = dict(budget=64, buffer=32, ns=(1, 2, 4), steps=12, warm=2, policies=("random", "nexus"))
CAPS = {"build": 60.0, "bandwidth": 15.0, "steps": 240.0, "profile": 30.0}  # seconds, 345 in all
WATCHDOG_MARGIN_S = 30.0


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


class ForwardTimes:
    """Per-forward timings of the batcher's forwards (CUDA events on a GPU, read after the timed
    window, so timing adds no sync): the number of rows and whether the static step ran."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.records: list[tuple[int, bool, object, object]] = []
        self.original = batcher_module.run_forward

    def __enter__(self):
        cuda = self.engine.device.type == "cuda"

        def timed(engine, chunks):
            steps0 = engine.step_runner.steps
            start = torch.cuda.Event(enable_timing=True) if cuda else time.perf_counter()
            if cuda:
                start.record()
            out = self.original(engine, chunks)
            end = torch.cuda.Event(enable_timing=True) if cuda else time.perf_counter()
            if cuda:
                end.record()
            self.records.append((len(chunks), engine.step_runner.steps > steps0, start, end))
            return out

        batcher_module.run_forward = timed
        return self

    def __exit__(self, *exc) -> None:
        batcher_module.run_forward = self.original

    def summary(self, n: int) -> dict:
        sync(self.engine.device)
        ms = []
        for rows, _, start, end in self.records:
            if rows == n:
                ms.append(start.elapsed_time(end) if hasattr(start, "elapsed_time") else 1000 * (end - start))
        ms.sort()
        return {
            "forwards": len(self.records),
            "mean_batch": sum(r[0] for r in self.records) / max(1, len(self.records)),
            "static_forwards": sum(r[1] for r in self.records),
            "full_batch_forwards": len(ms),
            "step_ms_median": statistics.median(ms) if ms else None,
            "step_ms_p90": ms[min(len(ms) - 1, int(0.9 * len(ms)))] if ms else None,
        }


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


def token(i: int, t: int) -> int:
    return (7 * i + 13 * t) % 500 + 1


def together(engine, sessions: list, steps: int, offset: int = 0, out: list | None = None) -> float:
    """Every session steps `steps` fixed tokens at once, one thread each; the decode wall, device
    synchronised at both ends. `out`: each session's last logits."""
    go = threading.Barrier(len(sessions) + 1)
    done = threading.Barrier(len(sessions) + 1)
    errors: list[str] = []
    last: list = [None] * len(sessions)

    def drive(i: int, s) -> None:
        try:
            go.wait()
            for t in range(steps):
                last[i] = s.step(token(i, offset + t))
            done.wait()
        except Exception:  # one failing session must not hang the others at a barrier
            errors.append(f"session {i}: {traceback.format_exc()}")
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
        if out is not None:
            out[:] = last
        return time.perf_counter() - t0
    except threading.BrokenBarrierError:
        raise RuntimeError("\n".join(errors) or "a barrier broke") from None
    finally:
        for t in threads:
            t.join(timeout=30)


def rounds_of(sessions) -> tuple[int, float]:
    return (
        sum(s.stats.rounds for s in sessions),
        sum(s.stats.scoring_s + s.stats.compaction_s for s in sessions),
    )


def exactness(engine, group: list, t: int) -> dict:
    """One token through the static step, `rewind(1)`, the same token through the eager forward:
    how far apart the logits are, per row, and whether their argmax agrees."""
    runner = engine.step_runner
    static: list = []
    eager: list = []
    together(engine, group, 1, offset=t, out=static)
    for s in group:
        s.rewind(1)
    runner.enabled = False  # eager for this one step; the captured graphs stay
    try:
        together(engine, group, 1, offset=t, out=eager)
    finally:
        runner.enabled = True
    rel = [((a - b).abs().max() / b.abs().max()).item() for a, b in zip(static, eager, strict=True)]
    agree = [int(a.argmax()) == int(b.argmax()) for a, b in zip(static, eager, strict=True)]
    return {"max_rel_dlogit": max(rel), "argmax_agree": sum(agree), "rows": len(agree)}


def step_rows(engine, policy: str, plan: dict, modes: dict, clock, report: dict, save) -> None:
    """modes: name -> static attention backend (None: eager)."""
    n_max = max(plan["ns"])
    cfg = CacheConfig(policy=policy, budget=plan["budget"], buffer=plan["buffer"], protect="sink")
    engine.set_decode_step("eager")  # no captures at session start: each backend captures below
    sessions = [engine.session(cfg) for _ in range(n_max)]
    try:
        report["prefill_s"][policy] = fill(engine, sessions, plan)
        base: dict[str, float] = {}
        t = 0
        for mode, backend in modes.items():
            if backend is not None:
                t0 = time.perf_counter()
                engine.set_step_attention(backend)
                engine.set_decode_step(plan["static_mode"])  # prepares (captures) every block now
                runner = engine.step_runner
                report["prepare"].append(
                    {
                        "policy": policy,
                        "mode": mode,
                        "seconds": time.perf_counter() - t0,
                        "captures": runner.captures,
                        "capture_failures": runner.capture_failures,
                        "capture_s": runner.capture_s,
                        "capture_each_s": list(runner.capture_each_s),
                    }
                )
            engine.step_runner.enabled = backend is not None
            for n in plan["ns"]:
                unit = f"{policy} N={n} {mode}"
                if not clock.allows("steps"):
                    report["skipped"].append({"unit": unit, "error": "time"})
                    continue
                t0 = time.perf_counter()
                group = sessions[:n]
                try:
                    together(engine, group, plan["warm"], offset=t)  # first use outside the timing
                    t += plan["warm"]
                    rounds0, round_s0 = rounds_of(group)
                    sched = engine.batcher
                    with ForwardTimes(engine) as times:
                        wall = together(engine, group, plan["steps"], offset=t)
                    t += plan["steps"]
                    rounds1, round_s1 = rounds_of(group)
                    row = {"policy": policy, "n": n, "mode": mode, "attention": backend or "-"}
                    row.update(times.summary(n))
                    tok_s = n * plan["steps"] / wall
                    if n == plan["ns"][0]:
                        base[mode] = tok_s
                    step_ms = row["step_ms_median"] or 1000 * wall / plan["steps"]
                    row.update(
                        wall_step_ms=1000 * wall / plan["steps"],
                        tokens_s=tok_s,
                        vs_bound=step_ms / (1000 * report["bound_s"]),
                        vs_n1=tok_s / base[mode] if mode in base else None,
                        rounds=rounds1 - rounds0,
                        round_s=round_s1 - round_s0,
                        round_share=(round_s1 - round_s0) / wall,
                        static_steps=engine.step_runner.steps,
                        batcher_forwards=sched.forwards if sched else None,
                    )
                    if backend is not None:
                        row["exactness"] = exactness(engine, group, t)
                        t += 1
                    report["steps"].append(row)
                except torch.OutOfMemoryError:
                    raise  # the caller records it and frees the sessions
                except Exception:  # a unit that fails must not end the run
                    report["skipped"].append({"unit": unit, "error": traceback.format_exc()})
                clock.tick("steps", time.perf_counter() - t0)
                save()
        engine.step_runner.enabled = True
    finally:
        engine.step_runner.enabled = True


def free(engine) -> None:
    """Give the last policy's slabs and graphs back before the next one allocates: its sessions'
    blocks leave their pools (and their batches and graphs with them)."""
    gc.collect()
    if engine.device.type == "cuda":
        torch.cuda.empty_cache()


def profile(engine, plan: dict, report: dict, static_mode: str) -> None:
    """Device time per kernel over a few steps at the smallest and the largest N: the captured step,
    and the uncaptured static step with a profiler range around its attention (a graph's replay
    has no ranges inside)."""
    cfg = CacheConfig(policy="random", budget=plan["budget"], buffer=plan["buffer"], protect="sink")
    cuda = engine.device.type == "cuda"
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    engine.set_step_attention("auto")  # the default backend
    engine.set_decode_step(static_mode)
    decoder = engine.step_runner.decoder  # what the step runs (a CPU's packed twin, else the plain one)
    for n in (min(plan["ns"]), max(plan["ns"])):
        report["profile"] += profile_n(engine, cfg, plan, n, decoder, acts, static_mode)
        free(engine)  # the sessions, their block and its graphs went with profile_n's frame


def profile_n(engine, cfg, plan: dict, n: int, decoder, acts, static_mode: str) -> list[dict]:
    sessions = [engine.session(cfg) for _ in range(n)]  # their block is prepared (captured) here
    fill(engine, sessions, plan)
    runner = engine.step_runner
    rows = []
    for captured in (True, False):
        batches = [b for pool in engine.pools.values() for blk in pool.blocks for b in blk.batches.values()]
        graphs = [(b, b.graph) for b in batches]
        attend = decoder.attend
        if not captured:
            for b in batches:
                b.graph = None

            def ranged(*args, _attend=attend):
                with torch.profiler.record_function("kvagent.attention"):
                    return _attend(*args)

            decoder.attend = ranged
        try:
            together(engine, sessions, plan["warm"])
            steps = 4
            with torch.profiler.profile(activities=acts, experimental_config=every_thread()) as prof:
                together(engine, sessions, steps)
        finally:
            decoder.attend = attend
            for b, g in graphs:
                b.graph = g
        rows.append(profile_row(prof, n, steps, captured and static_mode == "graph", runner))
    return rows


def every_thread():
    """The forwards run on the batcher's thread, which a default profile does not see."""
    try:
        return torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
    except TypeError:  # a torch without the option: the calling threads only (the report says so)
        return None


def profile_row(prof, n: int, steps: int, captured: bool, runner) -> dict:
    events = prof.key_averages()
    cuda_type = torch.autograd.DeviceType.CUDA

    def device_us(e) -> float:
        return getattr(e, "self_device_time_total", 0.0) or 0.0

    kernels = [e for e in events if getattr(e, "device_type", None) == cuda_type]
    total = sum(device_us(e) for e in kernels)
    attention = next((e for e in events if e.key == "kvagent.attention"), None)
    attn_us = getattr(attention, "device_time_total", 0.0) if attention else 0.0
    if not kernels:  # a CPU: host time stands in (marked)
        total = sum(e.self_cpu_time_total for e in events if e.key.startswith("aten::"))
        attn_us = attention.cpu_time_total if attention else 0.0
    top = sorted(kernels or events, key=lambda e: device_us(e) or e.self_cpu_time_total, reverse=True)[:12]
    return {
        "n": n,
        "captured": captured,
        "clock": "device" if kernels else "host (no device)",
        "step_us": total / steps,
        "attention_share": attn_us / total if total and attention else None,
        "device_kernels_per_step": sum(e.count for e in kernels) / steps,
        "launches_per_step": sum(e.count for e in events if e.key in ("cudaLaunchKernel", "cudaGraphLaunch"))
        / steps,
        "aten_ops_per_step": sum(e.count for e in events if e.key.startswith("aten::")) / steps,
        "top": [(e.key[:120], (device_us(e) or e.self_cpu_time_total) / steps) for e in top],
        "attention_backend": runner.decoder.attention,
    }


def versions(device: torch.device) -> dict:
    out = {"torch": torch.__version__, "python": platform.python_version()}
    try:
        import transformers

        out["transformers"] = transformers.__version__
    except ImportError:
        pass
    if device.type == "cuda":
        out["cuda"] = torch.version.cuda
        out["device_name"] = torch.cuda.get_device_name(device)
        out["capability"] = list(torch.cuda.get_device_capability(device))
        try:
            q = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
            out["driver"] = subprocess.run(q, capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError) as e:
            out["driver"] = f"unknown ({type(e).__name__})"
    else:
        out["cuda"] = out["driver"] = "none (CPU run)"
    return out


def memory(device: torch.device) -> dict:
    if device.type != "cuda":
        return {"max_memory_allocated": None, "mem_free": None, "mem_total": None, "note": "CPU run"}
    free_b, total_b = torch.cuda.mem_get_info(device)
    return {
        "max_memory_allocated": torch.cuda.max_memory_allocated(device),
        "mem_free": free_b,
        "mem_total": total_b,
    }


def markdown(report: dict) -> str:
    lines = [
        "# Static decode step: eager vs static / captured",
        "",
        f"{report['device']}, {report['dtype']}, {report['layers']} of {report['full_layers']} layers, "
        f"K={report['plan']['budget']}, r={report['plan']['buffer']}; "
        + ", ".join(f"{k} {v}" for k, v in report["versions"].items()),
        "",
    ]
    if report.get("bandwidth"):
        bw = report["bandwidth"]
        lines += [
            f"Copy bandwidth {bw['gb_s']:.0f} GB/s; weights read a step {report['step_bytes'] / 1e9:.2f} GB "
            f"(input embedding left out); bound {1000 * report['bound_s']:.2f} ms a step.",
            "",
        ]
    if report["steps"]:
        lines += [
            "| policy | N | mode | attention | median ms | p90 ms | tokens/s | / bound | / N=1 | "
            "mean batch | rounds' share | exact (rel, argmax) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in report["steps"]:
            ex = r.get("exactness")
            exs = f"{ex['max_rel_dlogit']:.1e}, {ex['argmax_agree']}/{ex['rows']}" if ex else "-"
            med = r["step_ms_median"] or r["wall_step_ms"]
            p90 = r["step_ms_p90"] or r["wall_step_ms"]
            v1 = f"{r['vs_n1']:.2f}" if r["vs_n1"] else "-"
            lines.append(
                f"| {r['policy']} | {r['n']} | {r['mode']} | {r['attention']} | {med:.2f} | {p90:.2f} | "
                f"{r['tokens_s']:.1f} | {r['vs_bound']:.2f} | {v1} | {r['mean_batch']:.1f} | "
                f"{100 * r['round_share']:.2f}% | {exs} |"
            )
        lines.append("")
    for p in report["prepare"]:
        lines.append(
            f"- prepare {p['policy']} {p['mode']}: {p['captures']} captures ({p['capture_failures']} failed), "
            f"{p['capture_s']:.1f} s"
        )
    for p in report["profile"]:
        share = f"{100 * p['attention_share']:.0f}%" if p["attention_share"] is not None else "-"
        lines.append(
            f"- profile N={p['n']} {'captured' if p['captured'] else 'uncaptured'}: {p['step_us'] / 1000:.2f} ms "
            f"({p['clock']}), attention {share} ({p['attention_backend']}), "
            f"{p['device_kernels_per_step']:.0f} device kernels, {p['launches_per_step']:.0f} launches a step"
        )
    mem = report.get("memory") or {}
    if mem.get("max_memory_allocated"):
        lines.append(
            f"- memory: peak {mem['max_memory_allocated'] / 2**30:.1f} GiB, "
            f"free {mem['mem_free'] / 2**30:.1f} of {mem['mem_total'] / 2**30:.1f} GiB"
        )
    if report["skipped"]:
        lines += ["", "Skipped:"] + [
            f"- {s['unit']}: {s['error'].splitlines()[-1][:300]}" for s in report["skipped"]
        ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    from kvagent.cli.settings import add_arguments  # the commands' --device (no typer needed)

    add_arguments(ap, engine=["device"], device="cuda")
    ap.add_argument("--quick", action="store_true", help="tiny shapes: the same code in seconds")
    ap.add_argument("--layers", type=int, default=None, help="model depth (default: as many as fit)")
    ap.add_argument(
        "--attention", default="split,sdpa", help="static attention backends to measure (attention_step.py)"
    )
    ap.add_argument("--sync-rounds", action="store_true", help="device syncs around rounds (profiling)")
    ap.add_argument("--total-s", type=float, default=sum(CAPS.values()))
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("graph_step: no CUDA device; use --device cpu (with --quick)", file=sys.stderr)
        return 2
    if args.sync_rounds:
        from kvagent.runtime import clock as round_clock

        round_clock.SYNC = True
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plan = dict(QUICK if args.quick else FULL)
    plan["static_mode"] = "graph" if device.type == "cuda" else "static"
    shape = gpu_shapes.QWEN3_QUICK if args.quick else gpu_shapes.QWEN3_32B
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    backends = args.attention.split(",")
    modes = {"eager": None, **{f"{plan['static_mode']}:{b}": b for b in backends}}
    clock = Clock(args.total_s, CAPS)
    report = {
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or "cpu",
        "dtype": str(dtype).removeprefix("torch."),
        "versions": versions(device),
        "plan": {k: list(v) if isinstance(v, tuple) else v for k, v in plan.items()},
        "full_layers": shape["num_hidden_layers"],
        "steps": [],
        "prepare": [],
        "profile": [],
        "skipped": [],
        "prefill_s": {},
        "threads": torch.get_num_threads(),
        "pid": os.getpid(),
    }
    lock = threading.Lock()

    def save() -> None:
        with lock:
            report["memory"] = memory(device)
            report["elapsed_s"] = clock.elapsed()
            atomic_write_json(out / "graph_step.json", report)
            atomic_write_text(out / "graph_step.md", markdown(report))

    def watchdog() -> None:  # whatever hangs (a capture, a barrier), the report is written
        report["skipped"].append(
            {"unit": "run", "error": f"watchdog: {args.total_s + WATCHDOG_MARGIN_S:.0f} s"}
        )
        save()
        os._exit(3)

    timer = threading.Timer(args.total_s + WATCHDOG_MARGIN_S, watchdog)
    timer.daemon = True
    timer.start()

    layers = args.layers or shape["num_hidden_layers"]
    if device.type == "cuda" and not args.layers:
        total = torch.cuda.get_device_properties(device).total_memory
        slab = plan["budget"] + 2 * plan["buffer"] + 256  # the slab's width, padding included
        kv = gpu_shapes.kv_bytes_per_token(shape, 1, dtype) * slab
        while layers > 1 and _bytes(shape, layers, dtype) + max(plan["ns"]) * kv * layers > 0.9 * total:
            layers -= 1
    model, build_s = gpu_shapes.build_qwen3(shape, layers, device, dtype)
    embed_bytes = model.model.embed_tokens.weight.numel() * model.model.embed_tokens.weight.element_size()
    report.update(
        layers=layers,
        build_s=build_s,
        weights_bytes=gpu_shapes.param_bytes(model),
        step_bytes=gpu_shapes.param_bytes(model) - embed_bytes,
    )
    engine = Engine.load(
        model, tokenizer=gpu_shapes.NoTokenizer(), device=device, dtype=dtype, max_batch=max(plan["ns"])
    )
    report["bandwidth"] = bandwidth(device, args.quick)
    report["bound_s"] = report["step_bytes"] / (report["bandwidth"]["gb_s"] * 1e9)
    report["bound_with_embedding_s"] = report["weights_bytes"] / (report["bandwidth"]["gb_s"] * 1e9)
    save()
    for policy in plan["policies"]:
        try:
            step_rows(engine, policy, plan, modes, clock, report, save)
        except Exception:
            report["skipped"].append({"unit": policy, "error": traceback.format_exc()})
        free(engine)  # its frame is gone: the policy's sessions, blocks and graphs with it
        save()
    if clock.allows("profile", 1.0):
        try:
            profile(engine, plan, report, plan["static_mode"])
        except Exception:
            report["skipped"].append({"unit": "profile", "error": traceback.format_exc()})
            free(engine)
    save()
    timer.cancel()
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
