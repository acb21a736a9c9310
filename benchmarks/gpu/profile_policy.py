"""Where a policy's decode step goes on the device: torch.profiler over a few decode steps of each
policy at the production per-layer shape (fewer layers), the ops ranked by their own device time
and by their own host time, side by side with a policy whose step is known to be fast.

    python benchmarks/gpu/profile_policy.py --policies snapkv,pyramidkv --out prof   # CUDA, ~1 min
    python benchmarks/gpu/profile_policy.py --quick --device cpu --out tmp           # the test
    python benchmarks/gpu/profile_policy.py --kernels both --out prof   # kernels A/B

`--kernels both` profiles each policy twice in one process: with PyTorch's own SDPA choice (cuDNN
on Hopper: the state before attention.decode_backends and attention.chunk_mask) and with the
runtime's, so the fixes' effect is a ratio measured side by side.

Writes OUT/profile.md (step times and the top ops per policy) and OUT/profile.json.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
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
from gpu_decode import Runner, sync  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from kvagent.fileio import atomic_write_json, atomic_write_text  # noqa: E402
from kvagent.runtime import Engine, attention  # noqa: E402
from kvagent.runtime.policies import available  # noqa: E402

TOP = 15  # ops listed per ranking
KERNELS = ("runtime", "pytorch", "both")


@contextlib.contextmanager
def decode_kernels(which: str):
    """`pytorch`: PyTorch's own SDPA choice for every call, as before attention.decode_backends and
    attention.chunk_mask existed (no kernel list for decode, a bool mask for chunks)."""
    if which == "runtime":
        yield
        return
    kept = attention.decode_backends, attention.chunk_mask
    attention.decode_backends = lambda device_type: None
    attention.chunk_mask = lambda q, kv, device: torch.ones(q, kv, dtype=torch.bool, device=device).tril(
        kv - q
    )
    try:
        yield
    finally:
        attention.decode_backends, attention.chunk_mask = kept


def parse(argv=None):
    from kvagent.cli.settings import add_arguments  # the commands' declarations (no typer needed)

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory for profile.md and profile.json")
    ap.add_argument("--quick", action="store_true", help="tiny shape (CPU smoke run; K 64, r 32)")
    ap.add_argument("--layers", type=int, default=8, help="depth (default 8; quick 2)")
    add_arguments(  # profiled in the order given; K 2048, r 128
        ap, many=["policy"], tokens=["budget"], one=["buffer"], engine=["device"], policies="snapkv,pyramidkv",
        budget=2048,
    )  # fmt: skip
    ap.add_argument("--length", type=int, default=4096, help="tokens before the steps (quick 256)")
    ap.add_argument("--steps", type=int, default=8, help="decode steps timed, then profiled (quick 4)")
    ap.add_argument(
        "--kernels",
        choices=KERNELS,
        default="runtime",
        help="SDPA kernels: the runtime's choice, PyTorch's own, or both side by side",
    )
    args = ap.parse_args(argv)
    args.policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in args.policies if p not in available()]
    if unknown or not args.policies:
        ap.error(f"--policies: {', '.join(unknown) or 'none named'}; choose from {', '.join(available())}")
    if args.quick:
        args.layers, args.budget, args.buffer, args.length, args.steps = 2, 64, 32, 256, 4
    return args


def ranked(prof, key: str, device: bool) -> list[dict]:
    rows = []
    for e in prof.key_averages():
        rows.append(
            {
                "op": e.key,
                "count": e.count,
                "self_device_ms": getattr(e, "self_device_time_total", 0.0) / 1000,
                "self_host_ms": e.self_cpu_time_total / 1000,
            }
        )
    rows.sort(key=lambda r: -r[key])
    return [r for r in rows if r[key] > 0][:TOP] if device or key == "self_host_ms" else rows[:TOP]


def one(engine, policy: str, kernels: str, args) -> dict:
    with decode_kernels(kernels):
        return _profiled(engine, policy, args) | {"kernels": kernels}


def _profiled(engine, policy: str, args) -> dict:
    runner = Runner(engine, policy, args.budget, args.buffer, 512, hints={})
    grow = runner.grow(args.length)
    timed = runner.window(args.steps)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if engine.device.type == "cuda" else [])
    toks = runner._ids(args.steps)
    sync(engine.device)
    with profile(activities=activities) as prof:
        for t in toks:
            runner.session.step(t)
        sync(engine.device)
    on_device = engine.device.type == "cuda"
    return {
        "policy": policy,
        "prefill": grow,
        "step_ms": timed["step_ms"],
        "rounds": timed["rounds"],
        "entries": timed["entries"],
        "by_device": ranked(prof, "self_device_ms", True) if on_device else [],
        "by_host": ranked(prof, "self_host_ms", False),
    }


def markdown(meta: dict, rows: list[dict]) -> str:
    lines = [
        "# Decode-step profile per policy",
        "",
        f"{meta['date']}, {meta['device']}, torch {meta['torch']}; {meta['layers']} layers of "
        f"{meta['shape']}, K={meta['budget']}, r={meta['buffer']}, {meta['length']} tokens before "
        f"{meta['steps']} timed and {meta['steps']} profiled decode steps.",
        "",
        "| policy | SDPA kernels | prefill tok/s | step ms | rounds in the timed steps | most entries in a layer |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        tok_s = r["prefill"]["tok_s"] if r["prefill"] else float("nan")
        lines.append(
            f"| {r['policy']} | {r['kernels']} | {tok_s:.0f} | {r['step_ms']:.2f} | {r['rounds']} | {r['entries']} |"
        )
    lines += ratios(rows)
    for r in rows:
        for key, title in (("by_device", "own device time"), ("by_host", "own host time")):
            if not r[key]:
                continue
            lines += [
                "",
                f"## {r['policy']} ({r['kernels']} kernels): top ops by {title} ({meta['steps']} steps)",
                "",
                "| op | calls | own device ms | own host ms |",
                "|---|---:|---:|---:|",
            ]
            lines += [
                f"| `{o['op']}` | {o['count']} | {o['self_device_ms']:.2f} | {o['self_host_ms']:.2f} |"
                for o in r[key]
            ]
    return "\n".join(lines) + "\n"


def ratios(rows: list[dict]) -> list[str]:
    """runtime / pytorch per policy, where both were profiled: the fix's effect, side by side."""
    by = {(r["policy"], r["kernels"]): r for r in rows}
    pairs = [
        (p, by[p, "runtime"], by[p, "pytorch"]) for p, k in by if k == "runtime" and (p, "pytorch") in by
    ]
    if not pairs:
        return []
    out = [
        "",
        "| policy | step, runtime / pytorch kernels | prefill tok/s, runtime / pytorch kernels |",
        "|---|---:|---:|",
    ]
    for p, a, b in pairs:
        pre = a["prefill"]["tok_s"] / b["prefill"]["tok_s"] if a["prefill"] and b["prefill"] else float("nan")
        out.append(f"| {p} | {a['step_ms'] / b['step_ms']:.3f} | {pre:.3f} |")
    return out


def main(argv=None) -> int:
    args = parse(argv)
    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shape = gpu_shapes.QWEN3_QUICK if args.quick else gpu_shapes.QWEN3_32B
    model, _ = gpu_shapes.build_qwen3(shape, args.layers, device, dtype)
    engine = Engine.load(model, tokenizer=gpu_shapes.NoTokenizer(), device=device, dtype=dtype)
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "shape": "qwen3-quick" if args.quick else "qwen3-32b",
        **{k: getattr(args, k) for k in ("layers", "budget", "buffer", "length", "steps", "kernels")},
    }
    kernels = ("pytorch", "runtime") if args.kernels == "both" else (args.kernels,)
    out = Path(args.out)
    rows: list[dict] = []
    for i, policy in enumerate(args.policies):
        # the order flips from one policy to the next, so warm-up favours neither setting throughout
        for k in kernels if i % 2 == 0 else kernels[::-1]:
            rows.append(one(engine, policy, k, args))
            # after each run, so a run cut short keeps what it profiled
            atomic_write_json(out / "profile.json", {"meta": meta, "rows": rows})
            atomic_write_text(out / "profile.md", markdown(meta, rows))
            print(f"{policy} ({k} kernels): step {rows[-1]['step_ms']:.2f} ms", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
