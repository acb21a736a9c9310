"""The correctness oracle for eviction: full attention over the whole sequence, with every
(layer, head, position) entry that was evicted before a token ran masked out for that token, must
give the logits the compacted cache gave. Used by the test suite; also handy for checking a new
policy (`check_session_against_oracle`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

ORACLE_ATTN = "kvagent_oracle"
_MASKS: dict[int, torch.Tensor] = {}  # layer -> (H_kv, T, T) bool visibility for the running reference


@dataclass
class ForwardRecord:
    start: int  # logical position of the chunk's first token
    ids: list[int]
    kept_before: list[torch.Tensor]  # per layer (H_kv, N) positions held when the chunk ran
    logits: torch.Tensor  # (rows, vocab) as returned, for the chunk's LAST `rows` tokens


class _Tracer:
    """A session's `tracer` (session.py): records each forward, cuts the records at a rewind."""

    def __init__(self) -> None:
        self.records: list[ForwardRecord] = []

    def forwarded(self, start: int, ids: list[int], kept_before: list[torch.Tensor], logits) -> None:
        kept = [k[0] if k.dim() == 3 else torch.empty((0, 0), dtype=torch.long) for k in kept_before]
        self.records.append(ForwardRecord(start, list(ids), kept, logits.detach().clone()))

    def rewound(self, logical_length: int) -> None:
        cut_records(self.records, logical_length)


@contextlib.contextmanager
def trace(session):
    """Record every forward of a persistent-mode session (cache contents before it, its logits);
    a `rewind` inside cuts the records back to the stream that remains."""
    if session.tracer is not None:
        raise RuntimeError("trace: this session is already traced")
    tracer = _Tracer()
    session.tracer = tracer
    try:
        yield tracer.records
    finally:
        session.tracer = None


def cut_records(records: list[ForwardRecord], length: int) -> None:
    """Drop what the records hold of positions >= length (a rewind took those tokens back), so
    they describe the stream as it now is: later forwards write those positions again."""
    keep = []
    for rec in records:
        fed = length - rec.start
        if fed <= 0:
            continue
        if fed < len(rec.ids):
            first_row = len(rec.ids) - rec.logits.shape[0]  # logits cover the chunk's last rows
            rec = ForwardRecord(
                rec.start, rec.ids[:fed], rec.kept_before, rec.logits[: max(0, fed - first_row)]
            )
        keep.append(rec)
    records[:] = keep


def random_episode(session, vocab: int, seed: int = 0, turns: int = 4) -> None:
    """A multi-turn episode of random tokens: a prompt, then decode runs (`step`) alternating with
    observation chunks (`append`), the shapes an agent episode has."""
    g = torch.Generator().manual_seed(seed)
    session.append(torch.randint(0, vocab, (24,), generator=g).tolist(), all_logits=True)
    for t in range(turns):
        for tok in torch.randint(0, vocab, (15 + 5 * t,), generator=g).tolist():
            session.step(tok)
        session.append(torch.randint(0, vocab, (30 + 17 * t,), generator=g).tolist(), all_logits=True)


def visibility_masks(records: list[ForwardRecord], n_layers: int, n_kv_heads: int) -> list[torch.Tensor]:
    """Per layer (H_kv, T, T): may the token at row p attend the key at column j."""
    total = records[-1].start + len(records[-1].ids)
    masks = [torch.zeros((n_kv_heads, total, total), dtype=torch.bool) for _ in range(n_layers)]
    for rec in records:
        s, q = rec.start, len(rec.ids)
        rows = torch.arange(s, s + q)
        for li in range(n_layers):
            m = masks[li]
            kept = rec.kept_before[li]
            if kept.numel():
                for h in range(n_kv_heads):
                    m[h, s : s + q, kept[h][kept[h] >= 0]] = True  # not PAD entries (position -1)
            # the chunk itself, causally
            m[:, rows.unsqueeze(1), rows.unsqueeze(0)] = torch.ones(q, q, dtype=torch.bool).tril()
    return masks


def _oracle_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    vis = _MASKS[module.layer_idx]  # (H_kv, T, T)
    group = query.shape[1] // key.shape[1]
    scores = torch.matmul(query, key.repeat_interleave(group, dim=1).transpose(-1, -2)) * scaling
    scores = scores.masked_fill(~vis.repeat_interleave(group, dim=0).unsqueeze(0), float("-inf"))
    probs = scores.float().softmax(-1).to(value.dtype)
    out = torch.matmul(probs, value.repeat_interleave(group, dim=1))
    return out.transpose(1, 2), None


def reference_logits(model, ids: list[int], masks: list[torch.Tensor]) -> torch.Tensor:
    """One forward over the whole sequence with per-layer, per-head visibility masks."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ORACLE_ATTN, _oracle_attention)
    AttentionMaskInterface.register(ORACLE_ATTN, lambda *a, **k: None)
    previous = model.config._attn_implementation
    _MASKS.clear()
    _MASKS.update(dict(enumerate(masks)))
    model.set_attn_implementation(ORACLE_ATTN)
    try:
        with torch.no_grad():
            out = model(
                input_ids=torch.tensor([ids], device=model.device),
                position_ids=torch.arange(len(ids), device=model.device).unsqueeze(0),
                use_cache=False,
            )
    finally:
        model.set_attn_implementation(previous)
        _MASKS.clear()
    return out.logits[0].float()


def check_session_against_oracle(session, records: list[ForwardRecord]) -> float:
    """Max |logit difference| between the session's recorded logits and the masked reference."""
    engine = session.engine
    ids = [t for rec in records for t in rec.ids]
    masks = [m.to(engine.device) for m in visibility_masks(records, engine.n_layers, engine.n_kv_heads)]
    ref = reference_logits(engine.model, ids, masks)
    worst = 0.0
    for rec in records:
        end = rec.start + len(rec.ids)
        rows = rec.logits.shape[0]
        if not rows:  # a rewind took back the tokens whose logits these were
            continue
        diff = (ref[end - rows : end] - rec.logits.to(ref.device)).abs().max().item()
        worst = max(worst, diff)
    return worst
