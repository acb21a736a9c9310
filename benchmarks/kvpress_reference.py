"""The reference side of benchmarks/pyramid_reference.py: kvpress's own SnapKVPress and PyramidKVPress
on token ids that script wrote, in kvpress's protocol (the context compressed once while it is
prefilled, then the next tokens teacher forced one at a time with their logical positions, as
kvpress's pipeline decodes). Runs in the kvpress venv, imports kvpress from there, never kvagent:

    .venv-kvpress/bin/python benchmarks/kvpress_reference.py --model DIR --ids IDS.json --out OUT.json

Writes per episode, press and compression ratio: the mean next-token KL from the full cache over
the forced tokens, and the entries each layer kept (what the press's schedule gave it)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from importlib.metadata import version

import torch
from kvpress import PyramidKVPress, SnapKVPress
from transformers import AutoModelForCausalLM, DynamicCache
from transformers.utils import logging as hf_logging


def run(model, ids: list[int], context: int, press) -> tuple[list[torch.Tensor], list[int]]:
    """Log-probs of each forced step, and each layer's cache length after the compressed prefill."""
    cache = DynamicCache()
    ctx = torch.tensor([ids[:context]])
    with torch.no_grad(), press(model) if press is not None else contextlib.nullcontext():
        model.model(input_ids=ctx, past_key_values=cache)
    kept = [int(layer.keys.shape[2]) for layer in cache.layers]
    out = []
    with torch.no_grad():
        for i, tok in enumerate(ids[context:]):
            step = model(
                input_ids=torch.tensor([[tok]]),
                past_key_values=cache,
                position_ids=torch.tensor([[context + i]]),
            )
            out.append(torch.log_softmax(step.logits[0, -1].double(), dim=-1))
    return out, kept


def mean_kl(ref: list[torch.Tensor], got: list[torch.Tensor]) -> float:
    kls = [float((p.exp() * (p - q)).sum()) for p, q in zip(ref, got, strict=True)]
    return sum(kls) / len(kls)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a local model directory (SmolLM2's safetensors copy)")
    ap.add_argument("--ids", required=True, help="JSON written by pyramid_reference.py")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    with open(args.ids, encoding="utf-8") as f:
        spec = json.load(f)
    context, window, kernel, beta = spec["context"], spec["window"], spec["kernel"], spec["beta"]
    torch.manual_seed(0)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    hf_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    presses = {
        "snapkv": lambda cr: SnapKVPress(compression_ratio=cr, window_size=window, kernel_size=kernel),
        "pyramidkv": lambda cr: PyramidKVPress(
            compression_ratio=cr, window_size=window, kernel_size=kernel, beta=beta
        ),
    }
    records = []
    for ep in spec["episodes"]:
        ref, _ = run(model, ep["ids"], context, None)
        forced = ep["ids"][context:]
        logp_full = [float(lp[t]) for lp, t in zip(ref, forced, strict=True)]
        for name, make in presses.items():
            for ratio in spec["keep_ratios"]:
                got, kept = run(model, ep["ids"], context, make(1.0 - ratio))
                records.append(
                    {
                        "episode": ep["name"],
                        "policy": name,
                        "keep_ratio": ratio,
                        "kl": mean_kl(ref, got),
                        "kept_per_layer": kept,
                    }  # fmt: skip
                )
                print(f"kvpress {ep['name'][:40]:<40} {name:<10} keep {ratio:.0%}: KL {records[-1]['kl']:.4f}",
                      file=sys.stderr, flush=True)  # fmt: skip
        records.append({"episode": ep["name"], "policy": "full", "logp_forced": logp_full})
    result = {"kvpress": version("kvpress"), "transformers": version("transformers"), "torch": torch.__version__,
              "records": records}  # fmt: skip
    # Atomic: a killed run leaves no half-written file (kvagent.fileio is not importable here).
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(args.out)), suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(result, f)
    os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
