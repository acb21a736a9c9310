"""Part 3: the batched engine (`Engine.load(..., max_batch=N)`): decode tokens/s with N sessions
driven concurrently from threads, each holding a K-entry cache, all in one run. Skipped, with the
reason recorded, when the runtime has no batched engine yet."""

from __future__ import annotations

import inspect
import threading
import time

import torch
from gpu_decode import config, sync

from kvagent.runtime import Engine


def landed() -> tuple[bool, str]:
    params = inspect.signature(Engine.load).parameters
    if "max_batch" in params:
        return True, "Engine.load takes max_batch"
    return False, "batched engine not landed: Engine.load has no max_batch parameter"


def run_n(model, tokenizer, device, dtype, n: int, plan: dict, timeout: float) -> dict:
    """N threads: each prefills K tokens into its own session, then all decode `steps` tokens at
    once; tokens/s = N * steps / wall of the decode phase (device synchronised at both ends)."""
    engine = Engine.load(model, tokenizer=tokenizer, device=device, dtype=dtype, max_batch=n)
    if device.type == "cuda":  # this N's own peak, not an earlier part's
        torch.cuda.reset_peak_memory_stats(device)
    k, r, steps = plan["budget"], plan["buffer"], plan["steps"]
    vocab = int(model.config.vocab_size)
    prefilled, go, done = (threading.Barrier(n + 1, timeout=timeout) for _ in range(3))
    errors: list[str] = []
    sessions: list = [None] * n

    def worker(i: int) -> None:
        gen = torch.Generator().manual_seed(1000 + i)
        ids = torch.randint(0, vocab - 512, (k + steps,), generator=gen).tolist()
        try:
            s = engine.session(config(plan["policy"], k, r, plan["chunk"]))
            sessions[i] = s
            s.append(ids[:k])
            prefilled.wait()
            go.wait()
            for t in ids[k:]:
                s.step(t)
            done.wait()
        except Exception as e:  # one failing session must not hang the others at a barrier
            errors.append(f"session {i}: {type(e).__name__}: {e}")
            for b in (prefilled, go, done):
                b.abort()

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(n)]
    t_start = time.perf_counter()
    for t in threads:
        t.start()
    try:
        prefilled.wait()
        sync(device)
        t_prefill = time.perf_counter() - t_start
        t0 = time.perf_counter()
        go.wait()
        done.wait()
        sync(device)
        wall = time.perf_counter() - t0
    except threading.BrokenBarrierError:
        raise RuntimeError("; ".join(errors) or "a barrier timed out") from None
    finally:
        for b in (prefilled, go, done):  # releases waiting workers at once if the main thread left early
            b.abort()
        for t in threads:
            t.join(timeout=5)
        engine.close()  # stops the batcher thread
    kv = [s.stats.total_kv_bytes for s in sessions if s is not None]
    row = {
        "n": n,
        "policy": plan["policy"],
        "budget": k,
        "steps": steps,
        "tokens_s": n * steps / wall,
        "step_ms": 1000 * wall / steps,
        "prefill_s": t_prefill,
        "kv_bytes_per_session": max(kv) if kv else 0,
        "peak_bytes": int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None,
    }
    return row


def plan_ns(ns: list[int], n_max: int | None) -> list[tuple[int, int]]:
    """(N to run, N asked) per asked N: an N over the largest that fits in memory runs at that
    largest N instead (once), so the top of the curve is measured rather than skipped."""
    out: list[tuple[int, int]] = []
    for asked in ns:
        n = asked if n_max is None else min(asked, n_max)
        if n >= 1 and n not in [m for m, _ in out]:
            out.append((n, asked))
    return out


def measured_fit(fit: dict, per_session: float | None) -> int | None:
    """The largest N whose batched peak, at `per_session` bytes a session beside the weights,
    stays inside 95% of the device; None before any row has measured it."""
    total, weights = fit.get("device_total_bytes"), fit.get("weights_bytes")
    if not per_session or not total or not weights:
        return None
    return int((0.95 * total - weights) // per_session)


def run(model, tokenizer, device, dtype, plan: dict, clock, skipped: list, hints: dict, fit: dict) -> dict:
    ok, why = landed()
    if not ok:
        skipped.append({"part": "batched", "what": "all N", "reason": why})
        return {"landed": False, "reason": why, "rows": []}
    rows = []
    rate = hints.get("evicting", {}).get("bulk_tok_s")
    step = hints.get("evicting", {}).get("step_s")
    n_max = fit.get("evicting_n_max")
    for asked in plan["ns"]:
        if n_max is not None and asked > n_max:
            over = f"memory: over the computed largest N, {n_max}, which runs instead" if n_max else "memory"
            skipped.append({"part": "batched", "what": f"N={asked}", "reason": over})
    per_session = None  # bytes one batched session added at the last row's peak (measured)
    for n, asked in plan_ns(plan["ns"], n_max):
        fits = measured_fit(fit, per_session)
        if fits is not None and n > fits:
            # The solo computation (fit) missed what batching adds per session; trust the last row.
            skipped.append(
                {
                    "part": "batched",
                    "what": f"N={n}",
                    "reason": f"memory: {per_session / 2**30:.2f} GiB a session at the last N's peak "
                    f"fits {fits}, which runs instead",
                }
            )
            if fits <= max((r["n"] for r in rows), default=0):
                continue
            n = fits
        # Heuristic prediction: prefill at the single-session rate, decode at most sqrt(N) times
        # slower per step than one session (the point of batching is that it is far less).
        need = (n * plan["budget"] / rate if rate else 0.0) + plan["steps"] * (step or 0.0) * n**0.5
        if not clock.allows("batched", need):
            skipped.append({"part": "batched", "what": f"N={n}", "reason": f"time (predicted {need:.0f} s)"})
            continue
        t0 = time.perf_counter()
        try:
            row = run_n(
                model, tokenizer, device, dtype, n, plan, timeout=max(30.0, clock.remaining("batched"))
            )
            rows.append(row | {"asked_n": asked})
            if row["peak_bytes"] and fit.get("weights_bytes"):
                per_session = (row["peak_bytes"] - fit["weights_bytes"]) / n
        except (RuntimeError, torch.OutOfMemoryError) as e:
            skipped.append(
                {"part": "batched", "what": f"N={n}", "reason": f"failed: {str(e).splitlines()[0][:300]}"}
            )
        clock.tick("batched", time.perf_counter() - t0)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    base = next((r["tokens_s"] for r in rows if r["n"] == 1), None)
    for r in rows:
        r["speedup_vs_n1"] = r["tokens_s"] / base if base else None
    return {"landed": True, "reason": why, "rows": rows}
