"""kvagent on a GPU at DeepSWE-Preview's real shape, in one command that ends by itself.

    python benchmarks/gpu/run.py --out gpu-out            # CUDA, about 8 minutes at most
    python benchmarks/gpu/run.py --quick --device cpu --out tmp   # tiny shapes, seconds (the test)

1. oracle: every registered policy vs the masked-attention reference on the tiny models, float32
   and bfloat16;
2. production: a Qwen3-32B-shaped model (random bf16 weights built on the device): decode step at
   8k / 32k / 64k (dense) and 8k (evicting, K=8192, r=128), eviction-round cost as a share of
   decode time, KV bytes per session, peak memory, the largest N sessions that fit;
3. long: every policy through 8k / 32k / 64k on the same shape with fewer layers (--long-layers),
   so evicting sessions reach 64k by real chunked prefill with eviction in the time cap;
4. batched: tokens/s at N = 1, 8, 32 concurrent sessions, if the batched engine has landed.

Writes OUT/gpu.json and OUT/gpu.md after every part. Needs torch (CUDA), transformers >= 5.17,
numpy; runs from the repository root without installing kvagent.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import resource
import signal
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for p in (str(HERE), str(ROOT)):  # the repository's kvagent, never an installed copy
    if p in sys.path:
        sys.path.remove(p)
    sys.path.insert(0, p)

import gpu_batched  # noqa: E402
import gpu_decode  # noqa: E402
import gpu_oracle  # noqa: E402
import gpu_report  # noqa: E402
import gpu_shapes  # noqa: E402
import torch  # noqa: E402
from gpu_clock import Clock  # noqa: E402

from kvagent.fileio import atomic_write_json, atomic_write_text  # noqa: E402
from kvagent.runtime import Engine  # noqa: E402
from kvagent.runtime.policies import available  # noqa: E402

GOAL_POLICIES = ("random", "nexus")  # measured first, so a time cap never skips the goals' rows
# steps = r: a window past the first round holds exactly one round per layer; short_steps for windows with
# none. chunk 512: dense prefill chunks on a cache run SDPA's MATH kernel (bool mask + GQA), whose
# fp32 score matrix is chunk x length x 64 heads; 512 keeps it near 8 GiB at 64k.
FULL = dict(
    lengths=[8192, 32768, 65536],
    budget=8192,
    buffer=128,
    steps=128,
    short_steps=64,
    warm=8,
    chunk=512,
    ns=[1, 8, 32],
)
QUICK = dict(
    lengths=[64, 256, 512], budget=64, buffer=32, steps=32, short_steps=8, warm=1, chunk=64, ns=[1, 2, 4]
)
CAPS = {"oracle": 40.0, "production": 190.0, "long": 110.0, "batched": 110.0}  # seconds, on one schedule


class OutOfTime(Exception):
    pass


def _alarm(signum, frame):
    raise OutOfTime()


def parse(argv=None):
    from kvagent.cli.settings import add_arguments  # the commands' declarations (no typer needed)

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory for gpu.json and gpu.md")
    add_arguments(ap, many=["policy"], engine=["device"], policies=None)  # None: every registered policy
    ap.add_argument("--quick", action="store_true", help="tiny shapes and lengths (CPU smoke run)")
    ap.add_argument("--budget-s", type=float, default=None, help="total time cap (default 450; quick 120)")
    ap.add_argument("--layers", type=int, default=None, help="production depth (default: 64, or what fits)")
    ap.add_argument(
        "--long-layers", type=int, default=None, help="depth of the long part (default 8; quick 1)"
    )
    ap.add_argument(
        "--parts",
        default=",".join(CAPS),
        help="comma list of oracle, production, long, batched (default: all); the time cap is "
        "shared among the parts named. long and batched run on production's model, so they need it",
    )
    args = ap.parse_args(argv)
    args.parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in args.parts if p not in CAPS]
    if unknown or not args.parts:
        ap.error(f"--parts: {', '.join(unknown) or 'none named'}; use a comma list of {', '.join(CAPS)}")
    if "production" not in args.parts and {"long", "batched"} & set(args.parts):
        ap.error("--parts: long and batched run on production's model; add production to the list")
    return args


def device_total_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def process_peak_bytes(device: torch.device) -> tuple[int, str]:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "torch.cuda.max_memory_allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "process max RSS"


def sdpa_probe(device: torch.device, shape: dict, dtype: torch.dtype) -> dict | None:
    """Can SDPA run the runtime's two call shapes on a fused kernel? (a chunk on a cache passes a
    bool mask with enable_gqa, which PyTorch's fused kernels reject, falling back to MATH)."""
    if device.type != "cuda":
        return None
    from torch.nn.attention import SDPBackend, sdpa_kernel

    fused = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]
    hq, hk, d = shape["num_attention_heads"], shape["num_key_value_heads"], shape["head_dim"]
    out = {}
    for name, q_len, kv_len in (("decode", 1, 4096), ("chunk_on_cache", 512, 4096)):
        q = torch.randn(1, hq, q_len, d, device=device, dtype=dtype)
        k = torch.randn(1, hk, kv_len, d, device=device, dtype=dtype)
        mask = (
            None
            if q_len == 1
            else torch.ones(q_len, kv_len, dtype=torch.bool, device=device).tril(kv_len - q_len)
        )
        try:
            with sdpa_kernel(fused):
                torch.nn.functional.scaled_dot_product_attention(q, k, k, attn_mask=mask, enable_gqa=True)
            out[name] = "fused"
        except RuntimeError:
            out[name] = "math fallback"
    return out


def free(device: torch.device) -> None:
    gc.collect()  # free the finished sessions (and their slots) before the next part measures
    if device.type == "cuda":
        torch.cuda.empty_cache()


def production(args, plan, device, dtype, shape, policies, clock, res, skipped):
    total = device_total_bytes(device)
    layers = args.layers or gpu_shapes.layers_that_fit(
        shape, dtype, total, plan["lengths"][-1] + plan["chunk"]
    )
    model, build_s = gpu_shapes.build_qwen3(shape, layers, device, dtype)
    engine = Engine.load(model, tokenizer=gpu_shapes.NoTokenizer(), device=device, dtype=dtype)
    full_depth = shape["num_hidden_layers"]
    long_depth = min(args.long_layers or (1 if args.quick else 8), layers)
    out = res["production"] = {
        "model": {
            "shape": "qwen3-quick" if args.quick else "qwen3-32b (DeepSWE-Preview)",
            "layers": layers,
            "full_depth": full_depth,
            "params": gpu_shapes.n_params(model),
            "weights_bytes": gpu_shapes.param_bytes(model),
            "build_s": build_s,
            "dtype": str(dtype).removeprefix("torch."),
            "kv_bytes_per_token": gpu_shapes.kv_bytes_per_token(shape, layers, dtype),
        },
        "plan": {k: v for k, v in plan.items() if k != "ns"},
        "decode": [],
        "round": [],
        "prefill": [],
        "memory": {},
    }
    hints: dict = {}
    peaks = {}
    for p in policies:
        evicts = p != "full"
        lengths = plan["lengths"] if (not evicts or long_depth >= layers) else plan["lengths"][:1]
        r = gpu_decode.sweep(
            engine,
            p,
            dict(plan, lengths=lengths, round_window=True),
            clock,
            "production",
            skipped,
            layers,
            hints,
        )
        out["decode"] += r["decode"]
        out["prefill"] += r["prefill"]
        if r["round"]:
            out["round"].append(r["round"])
        peaks[p] = {"peak_bytes": r["peak_bytes"], "kv_bytes": r.get("kv_bytes")}
        free(device)
        save(args, res)
    out["memory"] = gpu_report.memory_summary(out, peaks, total, plan, device)
    res["hints"] = hints
    return model, engine, long_depth


def long_part(args, plan, device, dtype, shape, policies, clock, res, skipped, long_depth, prod_layers):
    if long_depth >= prod_layers:
        res["long"] = {
            "depth": prod_layers,
            "note": "measured at the production depth (part 2)",
            "decode": [],
        }
        return
    model, build_s = gpu_shapes.build_qwen3(shape, long_depth, device, dtype, seed=1)
    engine = Engine.load(model, tokenizer=gpu_shapes.NoTokenizer(), device=device, dtype=dtype)
    out = res["long"] = {"depth": long_depth, "build_s": build_s, "decode": [], "prefill": []}
    hints: dict = {}
    for p in policies:
        r = gpu_decode.sweep(
            engine, p, dict(plan, round_window=False), clock, "long", skipped, long_depth, hints
        )
        out["decode"] += r["decode"]
        out["prefill"] += r["prefill"]
        free(device)
        save(args, res)
    del engine, model
    free(device)


def save(args, res) -> None:
    res["meta"]["elapsed_s"] = time.perf_counter() - res["meta"]["_t0"]
    out = Path(args.out)
    atomic_write_json(out / "gpu.json", {k: v for k, v in res.items() if k != "hints"} | {"meta": _meta(res)})
    atomic_write_text(out / "gpu.md", gpu_report.markdown(res))


def _meta(res) -> dict:
    return {k: v for k, v in res["meta"].items() if not k.startswith("_")}


def main(argv=None) -> int:
    args = parse(argv)
    t0 = time.perf_counter()
    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    elif args.device.startswith("cuda") and not torch.cuda.is_available():
        print("--device cuda: CUDA is not available here; use --device cpu (with --quick)", file=sys.stderr)
        return 1
    else:
        device = torch.device(args.device)
    plan = QUICK if args.quick else FULL
    shape = gpu_shapes.QWEN3_QUICK if args.quick else gpu_shapes.QWEN3_32B
    total_s = args.budget_s or (120.0 if args.quick else 450.0)
    caps = {k: v for k, v in CAPS.items() if k in args.parts}
    scale = total_s / sum(caps.values())
    clock = Clock(total_s, {k: v * scale for k, v in caps.items()})
    names = args.policies.split(",") if args.policies else available()
    policies = (
        ["full"]
        + [p for p in GOAL_POLICIES if p in names]
        + [p for p in names if p not in ("full", *GOAL_POLICIES)]
    )
    if device.type == "cpu":
        torch.set_num_threads(1)  # tiny shapes: more threads only spin on a shared CPU
    # bf16 is the production dtype; a CPU smoke run stays in float32 (CPU bf16 kernels are slow).
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    skipped: list = []
    res = {
        "meta": {
            "_t0": t0,
            "date": time.strftime("%Y-%m-%d %H:%M"),
            "quick": args.quick,
            "device": str(device),
            "device_name": torch.cuda.get_device_name(device)
            if device.type == "cuda"
            else platform.processor() or "cpu",
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "transformers": __import__("transformers").__version__,
            "python": platform.python_version(),
            "policies": policies,
            "budget_s": total_s,
            "caps_s": {k: round(v * scale, 1) for k, v in caps.items()},
            "sdpa": sdpa_probe(device, shape, torch.bfloat16),
        },
        "skipped": skipped,
    }
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(int(total_s + 20))  # a hard stop even if a unit runs far past its prediction
    status = 0
    try:
        part_s = res["meta"]["part_s"] = {}
        t = time.perf_counter()
        if "oracle" in args.parts:
            res["oracle"] = {
                "rows": gpu_oracle.run(device, policies, clock, skipped, turns=2 if args.quick else 4),
                "tolerance": gpu_report.TOLERANCE,
            }
            part_s["oracle"], t = time.perf_counter() - t, time.perf_counter()
            save(args, res)
        if "production" in args.parts:
            model, engine, long_depth = production(
                args, plan, device, dtype, shape, policies, clock, res, skipped
            )
            part_s["production"], t = time.perf_counter() - t, time.perf_counter()
            save(args, res)
        if "long" in args.parts:
            long_part(
                args, plan, device, dtype, shape, policies, clock, res, skipped, long_depth, engine.n_layers
            )
            part_s["long"], t = time.perf_counter() - t, time.perf_counter()
            save(args, res)
        if "batched" in args.parts:
            bplan = dict(plan, policy="random" if "random" in policies else policies[-1])
            res["batched"] = gpu_batched.run(
                model,
                engine.tokenizer,
                device,
                dtype,
                bplan,
                clock,
                skipped,
                res.get("hints", {}),
                res["production"]["memory"],
            )
            part_s["batched"] = time.perf_counter() - t
    except OutOfTime:
        res["meta"]["aborted"] = "hard time limit reached; later parts missing"
        status = 2
    finally:
        signal.alarm(0)
    res["meta"]["peak_bytes"], res["meta"]["peak_kind"] = process_peak_bytes(device)
    res["goals"] = gpu_report.goals(res) if "production" in res else []  # goals are production's
    save(args, res)
    print(f"wrote {Path(args.out) / 'gpu.json'} and gpu.md in {time.perf_counter() - t0:.0f} s")
    if status:
        # Threads of an interrupted part may still hold the device; the results are on disk.
        sys.stdout.flush()
        os._exit(status)
    return status


if __name__ == "__main__":
    sys.exit(main())
