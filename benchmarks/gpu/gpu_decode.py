"""Part 2: decode step time against logical length, eviction-round cost as a share of decode time,
KV bytes and peak memory, one session per policy growing through the lengths.

A row "at length L" times the `steps` decode steps that END at L (after `warm` untimed steps), so a
dense cache that doubles its capacity reaches exactly L and never reallocates past it. Evicting
sessions get there by real chunked prefill with eviction (the runtime feeds at most r tokens
between rounds), dense ones by chunked prefill at full attention: every cache holds what it would
after an episode of that length. Eviction rounds that fire inside a window are part of its step
time (amortised); the round cost is the session's scoring_s + compaction_s, which the evictor times
per layer with a device synchronize before and after, so it never absorbs the tail of the forward
still running on the GPU.
"""

from __future__ import annotations

import math
import time

import torch

from kvagent.runtime import CacheConfig


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def config(policy: str, budget: int, buffer: int, chunk: int) -> CacheConfig:
    # protect=sink: a synthetic stream has no prompt worth protecting. scope prefill+decode: rounds
    # fire during decode too, as in an agent's long assistant turns. Model-dependent policy
    # arguments (TriAttention's RoPE frequencies) come from the engine (Engine.model_facts).
    evicts = policy != "full"
    return CacheConfig(
        policy=policy,
        budget=budget if evicts else None,
        buffer=buffer,
        protect="sink",
        scope="prefill+decode",
        prefill_chunk=chunk,
    )


class Runner:
    """One policy's session on one engine; remembers prefill rates and step times for predictions."""

    def __init__(self, engine, policy: str, budget: int, buffer: int, chunk: int, hints: dict, seed: int = 0):
        self.engine = engine
        # Rates measured by earlier sessions of the same part and cache kind, for predictions.
        self.hints = hints.setdefault("full" if policy == "full" else "evicting", {})
        self.device = engine.device
        self.policy = policy
        self.session = engine.session(config(policy, budget, buffer, chunk))
        self.gen = torch.Generator().manual_seed(seed)
        self.vocab = int(engine.model.config.vocab_size)

    def _ids(self, n: int) -> list[int]:
        return torch.randint(0, max(2, self.vocab - 512), (n,), generator=self.gen).tolist()

    def predict(self, length: int, steps: int) -> float:
        """Seconds to grow to `length` and time `steps` steps there (0 when nothing measured yet)."""
        need = max(0, length - self.session.logical_length)
        rate, step = self.hints.get("prefill_tok_s"), self.hints.get("step_s")
        t = need / rate if rate and need else 0.0
        # Dense steps grow with the length: scale the last measured one by the KV length ratio.
        if step and self.policy == "full":
            step *= max(1.0, length / max(1, self.hints.get("step_len", length)))
        return t + steps * (step or 0.0)

    def grow(self, length: int) -> dict | None:
        need = length - self.session.logical_length
        if need <= 0:
            return None
        sync(self.device)
        t0 = time.perf_counter()
        self.session.append(self._ids(need))
        sync(self.device)
        dt = time.perf_counter() - t0
        self.hints["prefill_tok_s"] = need / dt
        if need >= self.hints.get("bulk_tokens", 0):  # the biggest fill: the batched part's prediction
            self.hints["bulk_tokens"], self.hints["bulk_tok_s"] = need, need / dt
        return {"tokens": need, "seconds": dt, "tok_s": need / dt, "to_length": length}

    def window(self, steps: int) -> dict:
        s = self.session
        toks = self._ids(steps)
        before = s.stats.to_dict()
        sync(self.device)
        t0 = time.perf_counter()
        for t in toks:
            s.step(t)
        sync(self.device)
        wall = time.perf_counter() - t0
        after = s.stats.to_dict()
        scoring = after["scoring_s"] - before["scoring_s"]
        compaction = after["compaction_s"] - before["compaction_s"]
        rounds_s = scoring + compaction  # timed per layer, synchronised on CUDA (evictor.py)
        self.hints["step_s"], self.hints["step_len"] = wall / steps, s.logical_length
        return {
            "policy": self.policy,
            "length": s.logical_length,
            "steps": steps,
            "step_ms": 1000 * wall / steps,
            "rounds": after["rounds"] - before["rounds"],
            "round_share": rounds_s / wall,
            "scoring_share": scoring / wall,
            "compaction_share": compaction / wall,
            "kv_bytes": after["total_kv_bytes"],
            "entries": max(after["entries"] or [0]),
        }

    def at(self, length: int, steps: int, warm: int) -> tuple[dict, dict | None]:
        """Grow to length - warm - steps, run `warm` untimed steps, time `steps` ending at `length`."""
        g = self.grow(length - warm - steps)
        if warm:
            for t in self._ids(warm):
                self.session.step(t)
        return self.window(steps), g


def sweep(engine, policy: str, plan: dict, clock, part: str, skipped: list, depth: int, hints: dict) -> dict:
    """Decode rows at plan['lengths'] (and, for an evicting policy with plan['round_window'], one
    window of 2r steps that starts one token short of a round right after a warm-up round in
    prefill) for one policy. Returns {"decode": [...], "round": row | None, "prefill": [...],
    "peak_bytes": int | None}."""
    k, r, warm = plan["budget"], plan["buffer"], plan["warm"]
    runner = Runner(engine, policy, k, r, plan["chunk"], hints)
    out = {"decode": [], "round": None, "prefill": [], "peak_bytes": None}
    if engine.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(engine.device)
    todo = [("decode", n) for n in plan["lengths"]]
    # The first round is due at K + r + the recent buffer (r under the recent-buffer framework, 0
    # under topk-all); later ones every r tokens.
    first = k + r + runner.session.config.recent_buffer
    if policy != "full" and plan.get("round_window"):
        start = first + r - 1  # prefill runs one round (warm-up), then sits one short of the next
        todo.append(("round", start))
        todo.sort(key=lambda x: x[1] if x[0] == "round" else x[1] - warm - plan["steps"])
    for kind, n in todo:
        # A window that cannot reach the first round has none to amortise: short_steps are enough.
        steps = plan["steps"] if policy != "full" and n >= first else plan.get("short_steps", plan["steps"])
        target, n_steps = (n + 2 * r, 2 * r) if kind == "round" else (n, steps)
        need = runner.predict(target, n_steps + warm)
        if runner.session.logical_length > (n if kind == "round" else n - warm - steps):
            skipped.append(_skip(part, policy, kind, n, depth, "an earlier window already passed it"))
            continue
        if not clock.allows(part, need):
            skipped.append(_skip(part, policy, kind, n, depth, f"time (predicted {need:.0f} s)"))
            continue
        t0 = time.perf_counter()
        try:
            if kind == "round":
                g = runner.grow(n)
                row = runner.window(2 * r)
            else:
                row, g = runner.at(n, steps, warm)
        except torch.OutOfMemoryError as e:
            skipped.append(_skip(part, policy, kind, n, depth, f"out of memory: {str(e).splitlines()[0]}"))
            del runner
            torch.cuda.empty_cache()
            return out
        row.update(depth=depth, budget=k if policy != "full" else None, buffer=r)
        if g:
            g.update(policy=policy, depth=depth, cache="evicting" if policy != "full" else "dense")
            out["prefill"].append(g)
        if kind == "round":
            out["round"] = row
        else:
            out["decode"].append(row)
        clock.tick(part, time.perf_counter() - t0)
    if engine.device.type == "cuda":
        out["peak_bytes"] = int(torch.cuda.max_memory_allocated(engine.device))
    out["kv_bytes"] = runner.session.stats.total_kv_bytes
    del runner
    return out


def _skip(part, policy, kind, n, depth, reason) -> dict:
    return {"part": part, "what": f"{policy} {kind} at L={n} ({depth} layers)", "reason": reason}


def ratio(rows: list[dict], policy: str, lo: int, hi: int) -> float | None:
    by = {r["length"]: r["step_ms"] for r in rows if r["policy"] == policy}
    if lo in by and hi in by and by[lo] > 0:
        return by[hi] / by[lo]
    return None


def finite(x) -> bool:
    return isinstance(x, int | float) and math.isfinite(x)
