"""Where PyramidKV's schedule loses attention on SmolLM2 (issue #32): on pyramid_reference.py's
protocol (the first `--context` tokens compressed once, the next `--forced` the queries that
matter), the attention the forced tokens pay, under the full cache, to the context entries each
schedule evicted, per layer. SnapKV's uniform budget and PyramidKV's at each `--beta` keep the
same total; the table says which layers each one starves.

    .venv/bin/python benchmarks/pyramid_mass.py --out runs/pyramid-mass [--keep 0.2] [--beta 20,5,2]

The kept sets are kvagent's own (a session's live positions per KV head after its one round);
the attention comes from transformers' eager SmolLM2 on the same ids. Lost mass is a proxy for the
KL pyramid_reference.py measures (a kept set's attention renormalises), read per layer.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from _pyramid_protocol import add_protocol_args, positive_floats, protocol_episodes, read_episodes
from transformers import AutoModelForCausalLM

from kvagent.fileio import atomic_write_json
from kvagent.runtime import CacheConfig, Engine
from kvagent.runtime.models import smollm2_dir


def forced_attention(model, ids: list[int], context: int) -> list[torch.Tensor]:
    """Per layer, (H_q, context): each query head's attention from the forced tokens to each context
    entry, averaged over the forced tokens."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_attentions=True)
    return [a[0, :, context:, :context].mean(dim=1) for a in out.attentions]


def kept_positions(engine, ids: list[int], cfg: CacheConfig) -> list[torch.Tensor]:
    """Per layer, (H_kv, n) logical positions the session kept after compressing `ids` once."""
    s = engine.session(cfg)
    s.append(ids)
    return [layer.live()[2][0] for layer in s.cache.layers]


def lost_mass(attn: torch.Tensor, kept: torch.Tensor) -> float:
    """Mean over query heads of the attention (from the full cache) on entries not kept."""
    h_q, context = attn.shape
    group = h_q // kept.shape[0]
    keep = torch.zeros(kept.shape[0], context, dtype=torch.bool)
    for h in range(kept.shape[0]):
        keep[h, kept[h][(kept[h] >= 0) & (kept[h] < context)]] = True
    keep = keep.repeat_interleave(group, dim=0)
    return float((attn * ~keep).sum(dim=1).mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_protocol_args(ap)
    ap.add_argument("--keep", type=float, default=0.2)
    ap.add_argument("--beta", default="20,5,2", help="pyramidkv's beta values, a comma list")
    args = ap.parse_args()
    betas = positive_floats(args.beta, "--beta")  # before the models load: a typo costs nothing
    loaded = read_episodes(args)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    engine = Engine.load("smollm2", dtype="float32", device="cpu")
    model = AutoModelForCausalLM.from_pretrained(
        smollm2_dir(), dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()
    k = int(args.context * args.keep)
    common = dict(budget=k, mode="reprefill", scope="prefill", protect="none", window=args.window,
                  framework="topk-all")  # fmt: skip
    schedules = {"snapkv": CacheConfig(policy="snapkv", policy_args={"kernel": args.kernel}, **common)}
    for b in betas:
        schedules[f"pyramidkv b={b:g}"] = CacheConfig(
            policy="pyramidkv",
            policy_args={"kernel": args.kernel, "beta": b, "window": args.window},
            **common,
        )
    rows = []
    for ep in protocol_episodes(loaded, args, engine.tokenizer):
        ids = ep["ids"]
        attn = forced_attention(model, ids, args.context)
        row = {
            "episode": ep["name"],
            "on_context": [float(a.sum(dim=1).mean()) for a in attn],
            "lost": {},
            "kept": {},
        }
        for name, cfg in schedules.items():
            kept = kept_positions(engine, ids[: args.context], cfg)
            row["lost"][name] = [lost_mass(a, p) for a, p in zip(attn, kept, strict=True)]
            row["kept"][name] = [int(p.shape[-1]) for p in kept]
            print(f"{ep['name'][:40]:<40} {name:<14} lost {sum(row['lost'][name]) / len(attn):.4f} of the "
                  f"forced tokens' attention, mean over layers", flush=True)  # fmt: skip
        rows.append(row)
        atomic_write_json(out / "pyramid_mass.json", {"args": vars(args), "rows": rows})
    print(markdown(rows, list(schedules)))


def markdown(rows: list[dict], names: list[str]) -> str:
    """Lost mass per layer third (bottom, middle, top), mean over episodes, and the layer budgets."""
    n_layers = len(rows[0]["on_context"])
    thirds = [
        range(0, n_layers // 3),
        range(n_layers // 3, 2 * n_layers // 3),
        range(2 * n_layers // 3, n_layers),
    ]
    lines = [
        "| schedule | kept, bottom..top | lost: layers 0-9 | 10-19 | 20-29 | all layers |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name in names:
        per_layer = [sum(r["lost"][name][li] for r in rows) / len(rows) for li in range(n_layers)]
        parts = [sum(per_layer[i] for i in t) / len(t) for t in thirds]
        kept = rows[0]["kept"][name]
        lines.append(f"| {name} | {kept[0]}..{kept[-1]} | " + " | ".join(f"{x:.4f}" for x in parts)
                     + f" | {sum(per_layer) / n_layers:.4f} |")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    main()
