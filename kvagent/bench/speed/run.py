"""`kvagent bench speed`'s measurements: decode step latency vs logical length per policy, eviction-round
cost (scoring vs compaction) as a share of decode time, KV bytes, and persistent vs reprefill prefill
tokens and wall time on a generated episode. Every number comes from one run, side by side; `report.py`
writes them out."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import torch

from kvagent.bench.speed.report import plot_speed, speed_markdown
from kvagent.runtime.config import CacheConfig


def _sync(engine) -> None:
    if engine.device.type == "cuda":
        torch.cuda.synchronize()


def _ids(gen: torch.Generator, n: int, vocab: int) -> list[int]:
    # Ordinary token ids, not the special tokens at the top of the vocabulary.
    return torch.randint(0, max(2, vocab - 512), (n,), generator=gen).tolist()


def speed_config(
    policy: str,
    budget: int | None,
    buffer: int,
    policy_args: dict | None = None,
    framework: str = "recent-buffer",
) -> CacheConfig:
    # protect=sink: the synthetic stream has no prompt worth protecting, and the budget need not
    # exceed a prompt length.
    return CacheConfig(
        policy=policy,
        budget=None if policy == "full" else budget,
        buffer=buffer,
        protect="sink",
        scope="prefill+decode",
        policy_args=dict(policy_args or {}),
        framework=framework,
    )


def decode_latency(
    engine,
    policy: str,
    lengths: list[int],
    budget: int,
    buffer: int = 128,
    steps: int = 256,
    seed: int = 0,
    progress=None,
    policy_args: dict | None = None,
    framework: str = "recent-buffer",
) -> list[dict]:
    """One session grows through `lengths`; at each, `steps` decode steps are timed (eviction rounds
    that fire during them included, so per-step time is the amortised cost)."""
    s = engine.session(speed_config(policy, budget, buffer, policy_args, framework))
    gen = torch.Generator().manual_seed(seed)
    vocab = engine.model.config.vocab_size
    rows = []
    for length in sorted(lengths):
        need = length - s.logical_length
        if need > 0:
            s.append(_ids(gen, need, vocab))
        toks = _ids(gen, steps, vocab)
        before = s.stats.to_dict()
        _sync(engine)
        t0 = time.perf_counter()
        for t in toks:
            s.step(t)
        _sync(engine)
        wall = time.perf_counter() - t0
        after = s.stats.to_dict()
        scoring = after["scoring_s"] - before["scoring_s"]
        compaction = after["compaction_s"] - before["compaction_s"]
        rows.append(
            {
                "policy": policy,
                "budget": None if policy == "full" else budget,
                "buffer": buffer,
                "length": length,
                "steps": steps,
                "step_ms": 1000 * wall / steps,
                "rounds": after["rounds"] - before["rounds"],
                "scoring_share": scoring / wall,
                "compaction_share": compaction / wall,
                "round_share": (scoring + compaction) / wall,
                "kv_bytes": after["total_kv_bytes"],
                "entries": max(after["entries"] or [0]),
            }
        )
        if progress:
            progress(1)
    return rows


def episode_cost(
    engine,
    stream,
    policy: str,
    budget: int,
    buffer: int = 128,
    policy_args=None,
    framework: str = "recent-buffer",
) -> list[dict]:
    """Prefill tokens, wall time and KV bytes of one episode, persistent vs reprefill."""
    from kvagent.bench.replay import replay

    rows = []
    for mode in ("persistent", "reprefill"):
        cfg = CacheConfig(
            policy=policy,
            budget=budget,
            buffer=buffer,
            mode=mode,
            policy_args=dict(policy_args or {}),
            framework=framework,
        )
        res = replay(engine, stream, cfg, lambda *a: None, probe=False)
        st = res.stats
        rows.append(
            {
                "policy": policy,
                "mode": mode,
                "budget": budget,
                "turns": stream.n_turns,
                "tokens": len(stream.ids),
                "prefill_tokens": st["prefill_tokens"],
                "decode_tokens": st["decode_tokens"],
                "wall_s": res.wall_s,
                "forward_s": st["forward_s"],
                "rounds": st["rounds"],
                "kv_bytes": st["total_kv_bytes"],
            }
        )
    return rows


def run_speed(
    engine,
    model_name: str,
    policies: Sequence[str],
    lengths: Sequence[int],
    budget: int,
    buffer: int,
    steps: int,
    stream,
    out_dir: str | Path,
    policy_args: dict[str, dict] | None = None,
    progress=None,
    framework: str = "recent-buffer",
) -> dict:
    """Decode latency of every policy at every length, then persistent vs reprefill on `stream` for the
    first evicting policy; writes speed.json, speed.md and speed.png into `out_dir`."""
    import datetime

    from kvagent.bench.progress import NoProgress
    from kvagent.fileio import atomic_write_json, atomic_write_text
    from kvagent.runtime.budget import roomy_budget

    args = policy_args or {}
    progress = progress or NoProgress()
    meta = {
        "model": model_name,
        "device": str(engine.device),
        "dtype": str(engine.dtype).removeprefix("torch."),
        "budget": budget,
        "buffer": buffer,
        "framework": framework,
        "steps": steps,
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "threads": torch.get_num_threads(),
    }
    lat: list[dict] = []
    episode: list[dict] = []
    bar = progress.task("decode latency", len(policies) * len(lengths))
    for p in policies:
        lat += decode_latency(engine, p, list(lengths), budget, buffer, steps, progress=bar.advance,
                              policy_args=args.get(p), framework=framework)  # fmt: skip
    evicting = [p for p in policies if p != "full"]
    if evicting:
        k = max(budget, roomy_budget(stream.prompt_length))  # protect=prompt needs K > prompt
        episode = episode_cost(
            engine, stream, evicting[0], k, buffer, policy_args=args.get(evicting[0]), framework=framework
        )
    out = Path(out_dir)
    atomic_write_json(out / "speed.json", {"meta": meta, "decode": lat, "episode": episode})
    atomic_write_text(out / "speed.md", speed_markdown(lat, episode, meta))
    plot_speed(lat, out / "speed.png")
    return {"meta": meta, "decode": lat, "episode": episode}
