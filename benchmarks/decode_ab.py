"""Decode step latency of two versions of kvagent, side by side in one process: the older
package is imported under another name (`kvagent_before`, its imports and attention name
rewritten), each version gets its own copy of the model, and blocks of `Session.step` calls
alternate between the two versions, so load from other jobs hits both alike. Reports each cache
config's median step time per version and the ratio after / before, in CPU time (one torch
thread) and in wall time; the ratio is the median over block pairs. For refactors of the runtime's forward path.

    .venv/bin/python benchmarks/decode_ab.py --before /tmp/kv_before [--model smollm2] [--blocks 24]
        [--batched 8 --dtype bfloat16]

Solo (default): one session per version, the calling thread's CPU time. `--batched N`: each
version a batching engine (max_batch N) with N sessions stepping at once, one thread each, as a
server's conversations do; a block's CPU time is the whole process's (the forwards run on the
engine's batcher thread; only one version runs at a time), per batch step.

`--before DIR` holds an older `kvagent/` package (`git archive REV kvagent | tar -x -C DIR`);
"after" is this checkout's (or `--after DIR`'s). `--before` and `--after` the same is the A/A run
that shows the noise.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import os
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
# (policy, budget): the dense path, and evicting ones whose rounds fire during the timed steps.
CONFIGS = (("full", None), ("random", 256), ("snapkv", 256))


def renamed_copy(src: Path, dest: Path) -> None:
    """`src/kvagent` copied to `dest/kvagent_before`, every kvagent import and the registered
    attention name rewritten, so both versions load in one process."""
    target = dest / "kvagent_before"
    shutil.copytree(src / "kvagent", target, ignore=shutil.ignore_patterns("__pycache__"))
    for path in target.rglob("*.py"):
        text = path.read_text()
        text = re.sub(r"\bkvagent\.", "kvagent_before.", text)
        text = re.sub(r"\bfrom kvagent import\b", "from kvagent_before import", text)
        text = re.sub(r"\bimport kvagent\b(?!_)", "import kvagent_before", text)
        text = text.replace('ATTN_NAME = "kvagent"', 'ATTN_NAME = "kvagent_before"')
        path.write_text(text)


def engines(args, before_dir: Path):
    sys.path.insert(0, str(args.after))
    sys.path.insert(0, str(before_dir))
    old = importlib.import_module("kvagent_before.runtime")
    new = importlib.import_module("kvagent.runtime")
    loaded = new.Engine.load(args.model, device="cpu", dtype=args.dtype)
    out = []
    for pkg in (old, new):  # each its own copy of the weights, made alike
        model = copy.deepcopy(loaded.model)
        engine = pkg.Engine.load(
            model, tokenizer=loaded.tokenizer, device="cpu", dtype=args.dtype, max_batch=max(1, args.batched)
        )
        out.append((pkg, engine))
    del loaded
    return out


def together(sessions, tokens) -> None:
    """Each session steps through its own tokens, one thread each, all started at once."""
    barrier = threading.Barrier(len(sessions))
    errors: list[BaseException] = []

    def drive(s, toks):
        try:
            barrier.wait()
            for t in toks:
                s.step(t)
        except BaseException as e:  # re-raised below: a silent thread would time a shorter block
            errors.append(e)

    threads = [threading.Thread(target=drive, args=a) for a in zip(sessions, tokens, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def block_times(sessions, tokens, steps: int) -> tuple[float, float]:
    """(CPU ms, wall ms) per step of one timed block: solo, the calling thread's CPU time; batched,
    the process's (the batcher thread runs the forwards)."""
    if len(sessions) == 1:
        t0, c0 = time.perf_counter(), time.thread_time()
        for t in tokens[0]:
            sessions[0].step(t)
        return 1000 * (time.thread_time() - c0) / steps, 1000 * (time.perf_counter() - t0) / steps
    t0, c0 = time.perf_counter(), time.process_time()
    together(sessions, tokens)
    return 1000 * (time.process_time() - c0) / steps, 1000 * (time.perf_counter() - t0) / steps


def main() -> None:
    from kvagent.cli.settings import add_arguments  # the commands' --model and --dtype

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True, help="directory holding the older kvagent/")
    ap.add_argument(
        "--after", type=Path, default=ROOT, help="directory holding the newer kvagent/ (this checkout)"
    )
    add_arguments(ap, engine=["model", "dtype"], dtype="float32")
    ap.add_argument("--length", type=int, default=512, help="tokens prefilled before timing")
    ap.add_argument("--steps", type=int, default=16, help="decode steps per timed block")
    ap.add_argument("--blocks", type=int, default=24, help="timed blocks per version and config")
    ap.add_argument(
        "--batched", type=int, default=0, help="N > 1: N sessions per version on a batching engine"
    )
    ap.add_argument(
        "--threads", type=int, default=1, help="torch threads (1: the steadiest on a shared machine; "
        "more: read the wall times, the solo CPU time counts the calling thread only)"
    )  # fmt: skip
    args = ap.parse_args()
    for name in [n for n in sys.modules if n.split(".")[0] == "kvagent"]:
        del sys.modules[name]  # loaded for the options only: engines() imports --after's kvagent
    if args.batched == 1 or args.batched < 0:
        ap.error("--batched N needs N >= 2 (leave it out for the solo step)")
    if not (args.before / "kvagent").is_dir():
        ap.error("--before DIR must hold a kvagent/ package (git archive REV kvagent | tar -x -C DIR)")
    torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="kvagent-ab-"))
    try:
        renamed_copy(args.before, tmp)
        versions = engines(args, tmp)
        gen = torch.Generator().manual_seed(0)
        vocab = int(versions[1][1].model.config.vocab_size)
        n = max(1, args.batched)
        mode = f"batched N={n}, ms per batch step" if n > 1 else "solo"
        print(
            f"model {args.model} {args.dtype}, {mode}, L={args.length}, "
            f"{args.blocks} alternating blocks x {args.steps} steps, {args.threads} thread(s), "
            f"load {os.getloadavg()[0]:.1f}"
        )
        print(
            f"before: {Path(versions[0][0].__file__).parents[1]}, after: {Path(versions[1][0].__file__).parents[1]}"
        )
        rows = []
        for policy, budget in CONFIGS:
            # Session i's prompt is i * 7 tokens longer: batched sessions' lengths differ, as a server's do.
            prompts = [
                torch.randint(0, vocab - 512, (args.length + 7 * i,), generator=gen).tolist()
                for i in range(n)
            ]
            toks = [
                torch.randint(0, vocab - 512, (args.steps * (args.blocks + 1),), generator=gen).tolist()
                for _ in range(n)
            ]
            per_version = []
            for pkg, engine in versions:
                sessions = []
                for i in range(n):
                    cfg = pkg.CacheConfig(policy=policy, budget=budget, buffer=32, protect="sink", seed=i)
                    s = engine.session(cfg)
                    s.append(prompts[i])
                    sessions.append(s)
                block_times(sessions, [t[: args.steps] for t in toks], args.steps)  # warm-up
                per_version.append(sessions)
            times = {"before": ([], []), "after": ([], [])}
            for b in range(1, args.blocks + 1):
                block = [t[b * args.steps : (b + 1) * args.steps] for t in toks]
                order = [("before", per_version[0]), ("after", per_version[1])]
                for name, sessions in order if b % 2 else order[::-1]:
                    cpu, wall = block_times(sessions, block, args.steps)
                    times[name][0].append(cpu)
                    times[name][1].append(wall)
            rows.append((f"{policy}/{budget}", times))
            del per_version
        for i, clock in enumerate(("cpu", "wall")):
            print(f"{clock + ' ms/step':<14}{'before':>10}{'after':>10}{'after/before':>14}")
            for key, times in rows:
                b, a = (statistics.median(times[v][i]) for v in ("before", "after"))
                # the median of each block pair's ratio: pairs ran back to back, under one load
                r = statistics.median(
                    x / y for x, y in zip(times["after"][i], times["before"][i], strict=True)
                )
                print(f"{key:<14}{b:>10.3f}{a:>10.3f}{r:>14.3f}")
        for _, engine in versions:
            engine.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
