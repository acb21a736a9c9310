"""The next-token sampler of two versions side by side in one process: `kvagent/runtime/sampling.py`
at a git revision (`--before`, default the commit before the inverse-CDF sampler) and this
checkout's, on the same logits, in alternating blocks so that load from other jobs hits both alike.
Per setting (greedy, temperature, top-p, top-k, both) and vocabulary: the median ms a token of
each and the ratio before / after (the median over block pairs), under the thread count the CLI
sets (the machine's cores) and under one torch thread. Also checks that each draws from its own
seeded generator reproducibly.

    .venv/bin/python benchmarks/sampler_speed.py [--before 81b9c65] [--blocks 9] [--per-block 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
import types
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from kvagent.runtime import Sampling
from kvagent.runtime.sampling import sample_next

ROOT = Path(__file__).resolve().parents[1]
VOCABS = {"qwen3": 151_936, "smollm2": 49_152}
SETTINGS = {
    "greedy": Sampling(),
    "t=0.7": Sampling(temperature=0.7),
    "t=0.7 top_p=0.95": Sampling(temperature=0.7, top_p=0.95),
    "t=0.7 top_k=20": Sampling(temperature=0.7, top_k=20),
    "t=0.6 top_p=0.95 top_k=20": Sampling(temperature=0.6, top_p=0.95, top_k=20),  # Qwen3's thinking defaults
}


def old_sampler(rev: str):
    """`sample_next` of kvagent/runtime/sampling.py at `rev`, as its own module."""
    source = subprocess.run(
        ["git", "show", f"{rev}:kvagent/runtime/sampling.py"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    module = types.ModuleType("sampling_before")
    exec(compile(source, f"{rev}:kvagent/runtime/sampling.py", "exec"), module.__dict__)
    return module.sample_next


def logits_like(vocab: int, kind: str, seed: int) -> torch.Tensor:
    """`peaked`: a few strong candidates over a Gaussian tail (a confident next token); `flat`: the
    tail alone (a nucleus of a large part of the vocabulary)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(vocab, generator=g) * 2.0
    if kind == "peaked":
        x[torch.randint(0, vocab, (32,), generator=g)] += torch.linspace(14, 6, 32)
    return x


def nucleus_size(logits: torch.Tensor, sampling: Sampling) -> int:
    """Tokens top-p keeps (after top-k), counted with a full sort."""
    scores = logits / max(sampling.temperature, 1e-9)
    if sampling.top_k:
        scores = scores.topk(sampling.top_k).values
    probs = scores.sort(descending=True).values.softmax(0)
    return int(((probs.cumsum(0) - probs) < sampling.top_p).sum())


def block(fn, logits, sampling, n, seed) -> tuple[float, list[int]]:
    gen = torch.Generator().manual_seed(seed)
    t = time.perf_counter()
    ids = [fn(logits, sampling, gen) for _ in range(n)]
    return (time.perf_counter() - t) / n * 1e3, ids


def measure(before, after, logits, sampling, blocks, per_block):
    times = {"before": [], "after": []}
    for b in range(blocks):
        order = (
            (("before", before), ("after", after)) if b % 2 == 0 else (("after", after), ("before", before))
        )
        for name, fn in order:
            ms, ids = block(fn, logits, sampling, per_block, seed=b)
            again = block(fn, logits, sampling, 3, seed=b)[1]
            assert ids[:3] == again, f"{name}: the same seed drew different tokens"
            times[name].append(ms)
    ratio = statistics.median(b / a for b, a in zip(times["before"], times["after"], strict=True))
    return statistics.median(times["before"]), statistics.median(times["after"]), ratio


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", default="81b9c65", help="git revision of the older sampler")
    ap.add_argument("--blocks", type=int, default=9)
    ap.add_argument("--per-block", type=int, default=20)
    args = ap.parse_args()
    before = old_sampler(args.before)
    console = Console()
    load = os.getloadavg()[0]
    cores = os.cpu_count() or 1
    table = Table(title=f"next-token sampler, ms a token: {args.before} vs this checkout (load {load:.1f})")
    for col in ("vocab", "logits", "setting", "kept", "threads", "before", "after", "before / after"):
        table.add_column(col, justify="left" if col in ("vocab", "logits", "setting") else "right")
    for threads in (min(torch.get_num_threads(), cores), 1):
        torch.set_num_threads(threads)  # as the CLI does (load_engine), then one thread
        for vocab_name, vocab in VOCABS.items():
            for kind in ("peaked", "flat"):
                logits = logits_like(vocab, kind, seed=vocab)
                for name, sampling in SETTINGS.items():
                    if kind == "flat" and sampling.greedy:
                        continue
                    kept = str(nucleus_size(logits, sampling)) if sampling.top_p < 1 or sampling.top_k else ""
                    b, a, r = measure(before, sample_next, logits, sampling, args.blocks, args.per_block)
                    table.add_row(
                        vocab_name, kind, name, kept, str(threads), f"{b:.2f}", f"{a:.2f}", f"{r:.1f}x"
                    )
    console.print(table)
    console.print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
