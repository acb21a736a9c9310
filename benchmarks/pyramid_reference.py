"""kvagent's SnapKV and PyramidKV beside kvpress 0.5.5's on kvpress's own protocol (issue #32), in one
run: SmolLM2-135M float32, real agent trajectories, the first `--context` tokens compressed once,
the next `--forced` teacher forced; window 64, kernel 5, no protection. kvagent runs them here
(reprefill mode, scope prefill: one compression at the append, none while stepping); the reference
runs in its own venv on the same token ids (benchmarks/kvpress_reference.py).

    python3.11 -m venv .venv-kvpress && .venv-kvpress/bin/pip install kvpress==0.5.5  (torch==2.13.0)
    .venv/bin/python benchmarks/pyramid_reference.py --out runs/pyramid-ref \\
        [--episodes bundled:plant=0] [--keep 0.5,0.2] [--kvpress-json F]

Prints one table (mean next-token KL from each side's own full cache, and the entries the top and
bottom layers kept) and writes `pyramid_reference.json` to --out. --kvpress-json reuses a finished
reference run instead of running it again; --no-reference runs kvagent's side alone.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch
from _pyramid_protocol import add_protocol_args, positive_floats, protocol_episodes, read_episodes

from kvagent.fileio import atomic_write_json
from kvagent.runtime import CacheConfig, Engine
from kvagent.runtime.models import smollm2_dir

ROOT = Path(__file__).resolve().parent.parent
POLICIES = ("snapkv", "pyramidkv")


def forced_logprobs(session, ids: list[int], context: int) -> list[torch.Tensor]:
    session.append(ids[:context])
    return [torch.log_softmax(session.step(t).reshape(-1).double(), dim=-1) for t in ids[context:]]


def mean_kl(ref: list[torch.Tensor], got: list[torch.Tensor]) -> float:
    return sum(float((p.exp() * (p - q)).sum()) for p, q in zip(ref, got, strict=True)) / len(ref)


def kvagent_side(
    engine, episodes, context: int, keeps, window: int, kernel: int, betas, save=None
) -> list[dict]:
    """Each episode's full run, then each policy at each kept fraction (pyramidkv at each beta);
    `save(records)` after each run, so a run stopped early keeps what it finished."""
    records = []
    for ep in episodes:
        ref = forced_logprobs(engine.session(CacheConfig(window=window)), ep["ids"], context)
        forced = ep["ids"][context:]
        records.append(
            {
                "episode": ep["name"],
                "policy": "full",
                "logp_forced": [float(lp[t]) for lp, t in zip(ref, forced, strict=True)],
            }
        )
        runs = [("snapkv", None)] + [("pyramidkv", b) for b in betas]
        for policy, beta in runs:
            args = {"kernel": kernel} | ({"beta": beta, "window": window} if beta is not None else {})
            for keep in keeps:
                k = int(context * keep)  # kvpress keeps int(k_len * (1 - compression_ratio))
                # kvpress compresses once with no recent buffer: its protocol is the topk-all framework
                cfg = CacheConfig(policy=policy, budget=k, mode="reprefill", scope="prefill", protect="none",
                                  window=window, policy_args=args, framework="topk-all")  # fmt: skip
                s = engine.session(cfg)
                s.append(ep["ids"][:context])
                kept = list(s.stats.entries)
                got = [torch.log_softmax(s.step(t).reshape(-1).double(), dim=-1) for t in forced]
                records.append({"episode": ep["name"], "policy": policy, "keep_ratio": keep, "budget": k,
                                "beta": beta, "kl": mean_kl(ref, got), "kept_per_layer": kept,
                                "schedule": s.policy.schedule})  # fmt: skip
                label = policy if beta is None else f"{policy} b={beta:g}"
                print(
                    f"kvagent {ep['name'][:40]:<40} {label:<14} K={k}: KL {records[-1]['kl']:.4f}", flush=True
                )
                if save is not None:
                    save(records)
    return records


def _picked(r, policy, keep, beta) -> bool:
    return r["policy"] == policy and r.get("keep_ratio") == keep and (beta is None or r.get("beta") == beta)


def mean_over(records, policy, keep, field="kl", beta=None):
    xs = [r[field] for r in records if _picked(r, policy, keep, beta)]
    return sum(xs) / len(xs) if xs else float("nan")


def kept_span(records, policy, keep, beta=None) -> str:
    """Entries the bottom and top layers kept (first episode: the schedule, not the data, sets them)."""
    for r in records:
        if _picked(r, policy, keep, beta):
            return f"{r['kept_per_layer'][0]}..{r['kept_per_layer'][-1]}"
    return "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_protocol_args(ap)
    ap.add_argument("--keep", default="0.5,0.2", help="fractions of the context kept")
    ap.add_argument("--beta", default="20", help="pyramidkv's beta; a comma list runs each (a sweep)")
    ap.add_argument("--kvpress-python", default=str(ROOT / ".venv-kvpress/bin/python"))
    ap.add_argument("--kvpress-json", help="a finished reference run to reuse")
    ap.add_argument("--no-reference", action="store_true", help="kvagent's side only (its KL ratios)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    keeps = positive_floats(args.keep, "--keep")
    betas = positive_floats(args.beta, "--beta")
    if len(betas) > 1 and not args.no_reference:
        raise SystemExit("--beta: a sweep runs kvagent's side only; add --no-reference")
    loaded = read_episodes(args)
    torch.set_num_threads(args.threads)
    engine = Engine.load("smollm2", dtype="float32", device="cpu")
    episodes = protocol_episodes(loaded, args, engine.tokenizer)
    spec = {"context": args.context, "window": args.window, "kernel": args.kernel, "beta": betas[0],
            "keep_ratios": keeps, "episodes": episodes}  # fmt: skip
    atomic_write_json(out / "ids.json", spec)
    ref_path = Path(args.kvpress_json) if args.kvpress_json else out / "kvpress.json"
    reference = None
    if not args.kvpress_json and not args.no_reference:
        # The reference runs beside this process on the same ids (its own venv and transformers).
        cmd = [args.kvpress_python, str(ROOT / "benchmarks/kvpress_reference.py"), "--model", str(smollm2_dir()),
               "--ids", str(out / "ids.json"), "--out", str(ref_path)]  # fmt: skip
        reference = subprocess.Popen(cmd)
    try:
        ours = kvagent_side(engine, episodes, args.context, keeps, args.window, args.kernel, betas,
                            save=lambda recs: atomic_write_json(out / "kvagent.json", recs))  # fmt: skip
        if reference is not None and reference.wait() != 0:
            raise SystemExit(
                f"the kvpress reference failed (exit {reference.returncode}); see its output above"
            )
    finally:
        if reference is not None and reference.poll() is None:
            reference.terminate()  # Ctrl-C or a failure here: do not leave it running
    if args.no_reference:
        for k in keeps:
            snap = mean_over(ours, "snapkv", k)
            print(f"kvagent @{k:.0%}: snapkv KL {snap:.4f} ({kept_span(ours, 'snapkv', k)})")
            for b in betas:
                pyr = mean_over(ours, "pyramidkv", k, beta=b)
                print(f"  pyramidkv beta {b:g}: KL {pyr:.4f} ({kept_span(ours, 'pyramidkv', k, b)}), "
                      f"{pyr / snap:.2f}x snapkv")  # fmt: skip
        return
    ref = json.loads(ref_path.read_text(encoding="utf-8"))
    # The two full caches must agree, or the comparison is between different models.
    drift = max(
        abs(a - b)
        for x, y in zip(
            [r for r in ours if r["policy"] == "full"],
            [r for r in ref["records"] if r["policy"] == "full"],
            strict=True,
        )
        for a, b in zip(x["logp_forced"], y["logp_forced"], strict=True)
    )
    atomic_write_json(
        out / "pyramid_reference.json", {"kvagent": ours, "kvpress": ref, "full_logp_drift": drift}
    )
    print(f"\n{len(episodes)} episodes, context {args.context}, forced {args.forced}, window {args.window}, "
          f"kernel {args.kernel}, beta {betas[0]:g}; kvpress {ref['kvpress']} (transformers {ref['transformers']}); "
          f"full caches agree to {drift:.1e} in log p")  # fmt: skip
    head = "| policy |" + "".join(
        f" kvpress KL @{k:.0%} | kvagent KL @{int(args.context * k)} |" for k in keeps
    )
    print(head + "".join(f" kept @{k:.0%} (bottom..top) kvpress / kvagent |" for k in keeps))
    print("|---" * (1 + 3 * len(keeps)) + "|")
    for p in POLICIES:
        row = f"| {p} |"
        for k in keeps:
            row += f" {mean_over(ref['records'], p, k):.4f} | {mean_over(ours, p, k):.4f} |"
        for k in keeps:
            row += f" {kept_span(ref['records'], p, k)} / {kept_span(ours, p, k)} |"
        print(row)
    for k in keeps:
        print(f"kvagent pyramidkv / snapkv KL @{k:.0%}: {mean_over(ours, 'pyramidkv', k) / mean_over(ours, 'snapkv', k):.2f}x;"
              f" kvpress: {mean_over(ref['records'], 'pyramidkv', k) / mean_over(ref['records'], 'snapkv', k):.2f}x")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
