"""Fingerprints of eviction runs under the framework kvagent had before issue #26 (`topk-all`): what
each API call returned and what every layer and head kept after it. `test_framework.py` compares
today's `framework="topk-all"` against `data/topk_all_reference.json`, recorded by this module from
the code as it was (runtime of commit bf0214d, before the field existed):

    .venv/bin/python -m tests.runtime.topk_reference tests/runtime/data/topk_all_reference.json
    .venv/bin/python -m tests.runtime.topk_reference tests/runtime/data/topk_all_reference.json vase

The second form re-records one policy's cases: VaSE's, after its sampling weights moved onto a
grid (batched runs had reordered its sample); every other case is still the old code's.
"""

from __future__ import annotations

import hashlib
import json
import sys

import torch

from kvagent.runtime import CacheConfig

# The policy matrix's knobs (test_policy_matrix.py) plus every policy at its defaults, and the other
# axes a round reads: protect, scope, fractional budgets, adaptive head budgets, forget.
MATRIX_ARGS = {
    "streaming": {}, "random": {}, "snapkv": {}, "pyramidkv": {"min_budget": 32}, "h2o": {},
    "nexus": {"block": 8}, "tova": {}, "knorm": {}, "keydiff": {}, "rkv": {},
    "triattention": {"rope_theta": 10_000.0, "recent": 16}, "morphkv": {}, "vase": {},
    "segments": {},  # recorded when it was added (no marks in these episodes: its scorer's keep-sets)
}  # fmt: skip


def cases() -> dict[str, dict]:
    out = {}
    for policy, args in MATRIX_ARGS.items():
        for mode in ("persistent", "reprefill"):
            out[f"{policy}-{mode}"] = dict(policy=policy, mode=mode, policy_args=args)
            out[f"{policy}-{mode}-defaults"] = dict(policy=policy, mode=mode)
    out["random-prompt"] = dict(policy="random", protect="prompt")
    out["snapkv-prompt-reprefill"] = dict(policy="snapkv", protect="prompt", mode="reprefill")
    out["h2o-scope-prefill"] = dict(policy="h2o", scope="prefill")
    out["random-fraction"] = dict(policy="random", budget=0.5)
    out["snapkv-fraction-reprefill"] = dict(policy="snapkv", budget=0.5, mode="reprefill")
    out["snapkv-adaptive"] = dict(policy="snapkv", head_budget="adaptive")
    out["h2o-adaptive"] = dict(policy="h2o", head_budget="adaptive")
    out["nexus-forget"] = dict(policy="nexus", policy_args={"block": 8}, forget=True)
    out["h2o-forget"] = dict(policy="h2o", forget=True)
    return out


def config(case: dict, **extra) -> CacheConfig:
    kw = {k: v for k, v in case.items() if k != "forget"}
    kw = {"budget": 64, "buffer": 16, "protect": "sink", "seed": 5, **kw, **extra}
    return CacheConfig(**kw)


def _kept_digest(session) -> str:
    h = hashlib.sha256()
    for k in session.kept_positions():
        h.update(k.to(torch.long).cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def fingerprint(engine, case: dict, **extra) -> dict:
    """A fixed multi-turn episode: per API call two numbers of the logits it returned (a fixed
    random projection and the max, 8 significant digits), one digest of every layer's kept
    positions after every call, and the round and eviction counts."""
    session = engine.session(config(case, **extra))
    g = torch.Generator().manual_seed(11)
    probe = torch.randn(engine.model.config.vocab_size, generator=torch.Generator().manual_seed(3))
    logit_marks: list[list[float]] = []
    kept = hashlib.sha256()

    def note(logits: torch.Tensor) -> None:
        row = logits.reshape(-1, logits.shape[-1]).float()
        marks = ((row @ probe).sum().item(), row.max().item())
        logit_marks.append([float(f"{x:.8g}") for x in marks])
        kept.update(_kept_digest(session).encode())

    def ids(n: int) -> list[int]:
        return torch.randint(0, 512, (n,), generator=g).tolist()

    note(session.append(ids(24), all_logits=True))
    for turn in range(3):
        for tok in ids(15 + 5 * turn):
            note(session.step(tok))
        if case.get("forget") and turn == 1:
            session.forget(list(range(30, 45)))
        note(session.append(ids(30 + 17 * turn), all_logits=True))
    return {
        "logits": logit_marks,
        "kept": kept.hexdigest()[:32],
        "rounds": session.stats.rounds,
        "evicted": session.stats.evicted,
    }


def record(path: str, only: set[str] | None = None) -> None:
    """Write every case's fingerprint to `path`, or with `only` (policy names) re-record just those
    policies' cases into the existing file, keeping the others as recorded from the old code (a
    policy whose scores changed on purpose, as VaSE's weight grid did, gets new fingerprints)."""
    from kvagent.runtime import Engine
    from kvagent.runtime.models import load_qwen3_tokenizer, tiny_random_model

    torch.set_num_threads(2)
    tok = load_qwen3_tokenizer()
    out = {}
    if only:
        with open(path) as f:
            out = json.load(f)
    for kind in ("qwen3", "llama"):
        engine = Engine.load(tiny_random_model(kind, vocab_size=512, seed=1), tokenizer=tok, device="cpu")
        for name, case in cases().items():
            if not only or case["policy"] in only:
                out[f"{kind}/{name}"] = fingerprint(engine, case, framework="topk-all")
    with open(path, "w") as f:
        json.dump(out, f, separators=(",", ":"))


if __name__ == "__main__":
    # python -m tests.runtime.topk_reference PATH [POLICY,...]
    record(sys.argv[1], set(sys.argv[2].split(",")) if len(sys.argv) > 2 else None)
