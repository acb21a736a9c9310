"""Part 1: the masked-attention oracle for every registered policy on the tiny models, in float32
and bfloat16, on the benchmark's device (and Ada-KV head budgets for two of them).

float32 is the correctness proof (max |logit error| < 1e-4, the test suite's bar). In bfloat16 the
dense path itself differs from the eager reference by rounding, so an evicted cache is judged
against that: pass iff error <= max(BF16_C * unevicted error, BF16_FLOOR * max |reference logit|),
where the unevicted error is the `full` policy's on the same episode, model and dtype.
BF16_C = 2: on the development CPU the worst evicted / unevicted ratio over 7 policies x 2 models
was 1.35, so 2 leaves room for other kernels; wrong caches (a mislabelled position in the first
layer, two heads' keys swapped) gave errors about 10-20x the unevicted one and fail. BF16_FLOOR = 0.02
(relative to the largest logit, i.e. 2.5-5 bf16 ulps there) only matters when the dense path
happens to match the reference almost exactly, where 2x of a near-zero error would flag pure
rounding.
"""

from __future__ import annotations

import time

import torch
from gpu_shapes import NoTokenizer

from kvagent.runtime import CacheConfig, Engine
from kvagent.runtime.models import tiny_random_model
from kvagent.runtime.oracle import random_episode, reference_logits, trace, visibility_masks

F32_TOL = 1e-4
BF16_C = 2.0
BF16_FLOOR = 0.02
BUDGET, BUFFER, VOCAB = 64, 32, 512  # ~340 tokens; r = one nexus block (the recent buffer is whole blocks)
# Ada-KV head budgets (per-head buffers, attention per KV head: flash-attn per head on CUDA), as
# extra rows named POLICY+adaptive.
ADAPTIVE = ("snapkv", "h2o")


def oracle_error(session, records) -> tuple[float, float]:
    """(max |logit error| vs the masked reference, max |reference logit|) over every recorded row."""
    engine = session.engine
    ids = [t for rec in records for t in rec.ids]
    masks = [m.to(engine.device) for m in visibility_masks(records, engine.n_layers, engine.n_kv_heads)]
    ref = reference_logits(engine.model, ids, masks)
    worst, scale = 0.0, 0.0
    for rec in records:
        end = rec.start + len(rec.ids)
        rows = rec.logits.shape[0]
        r = ref[end - rows : end]
        worst = max(worst, (r - rec.logits.to(ref.device)).abs().max().item())
        scale = max(scale, r.abs().max().item())
    return worst, scale


def bf16_tolerance(unevicted: float, scale: float) -> float:
    return max(BF16_C * unevicted, BF16_FLOOR * scale)


def run_episode(engine, policy: str, turns: int = 4, seed: int = 5, head_budget: str = "uniform") -> dict:
    cfg = CacheConfig(
        head_budget=head_budget,
        policy=policy,
        budget=None if policy == "full" else BUDGET,
        buffer=BUFFER,
        protect="sink",
        seed=seed,
    )
    session = engine.session(cfg)
    with trace(session) as records:
        random_episode(session, vocab=VOCAB, turns=turns)
    err, scale = oracle_error(session, records)
    return {"rounds": session.stats.rounds, "tokens": session.logical_length, "err": err, "scale": scale}


def run(device: torch.device, policies: list[str], clock, skipped: list, turns: int = 4) -> list[dict]:
    """Rows per (model, dtype, policy); `turns=2` (--quick) halves the episode, still 3+ rounds."""
    rows = []
    for kind in ("qwen3", "llama"):
        for dtype in (torch.float32, torch.bfloat16):
            dname = str(dtype).removeprefix("torch.")
            model = tiny_random_model(kind, vocab_size=VOCAB, seed=1)
            engine = Engine.load(model, tokenizer=NoTokenizer(), device=device, dtype=dtype)
            base = None
            # `full` first: its error is the unevicted reference every other policy is judged by.
            plan = [(p, "uniform") for p in ["full"] + [p for p in policies if p != "full"]]
            plan += [(p, "adaptive") for p in ADAPTIVE if p in policies]
            for name, head_budget in plan:
                policy = name if head_budget == "uniform" else f"{name}+adaptive"
                if not clock.allows("oracle"):
                    skipped.append({"part": "oracle", "what": f"{kind}/{dname}/{policy}", "reason": "time"})
                    continue
                t0 = time.perf_counter()
                try:
                    r = run_episode(engine, name, turns, head_budget=head_budget)
                except Exception as e:  # a policy that cannot run this episode is a finding, not a crash
                    rows.append(_row(kind, dname, policy, error=f"{type(e).__name__}: {e}"))
                    continue
                if policy == "full":
                    base = r
                row = _row(kind, dname, policy, **r, wall_s=time.perf_counter() - t0)
                if dtype == torch.float32:
                    row["tol"] = F32_TOL
                elif base is not None:
                    row["unevicted_err"] = base["err"]
                    row["tol"] = bf16_tolerance(base["err"], max(r["scale"], base["scale"]))
                row["pass"] = row.get("tol") is not None and r["err"] <= row["tol"]
                row["reference"] = policy == "full"  # the unevicted baseline of its model and dtype
                rows.append(row)
                clock.tick("oracle", time.perf_counter() - t0)
            del engine, model
    return rows


def _row(kind, dtype, policy, **fields) -> dict:
    return {"model": f"tiny-random-{kind}", "dtype": dtype, "policy": policy, **fields}
