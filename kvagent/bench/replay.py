"""Teacher-forced replay of a token stream through one Session.

`replay` feeds the stream (appends via `append`, assistant tokens via `step`) and hands every scored
position's next-token logits to a callback; then it asks the planted-fact probe. The full-cache run
keeps, per scored position, the top-k of its distribution (`Reference`); other runs are compared
with it on the fly, so no run ever holds all distributions."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from kvagent.bench.stream import Stream
from kvagent.runtime.config import CacheConfig

TOPK = 256  # reference tokens kept per position; the rest of the mass is one tail bucket
PROBE_GREEDY_TOKENS = 24


@dataclass
class Reference:
    """The full-cache run: per scored position the top-k ids and log-probs and the tail mass."""

    ids: torch.Tensor  # (T, k) int64
    logp: torch.Tensor  # (T, k) float32
    argmax: torch.Tensor  # (T,)
    logp_true: torch.Tensor  # (T,)


@dataclass
class ReplayResult:
    kl: list[float] = field(default_factory=list)
    agree: list[bool] = field(default_factory=list)
    logp_true: list[float] = field(default_factory=list)
    probe_logp: float | None = None  # mean log p per value token, teacher forced
    probe_retrieved: bool | None = None  # greedy continuation of the answer prefix holds the value
    probe_text: str | None = None
    stats: dict = field(default_factory=dict)
    # (tokens fed, entries the fullest layer holds) after each segment: the KV memory over the episode
    memory: list[tuple[int, int]] = field(default_factory=list)
    # the most entries a layer may hold between forwards, as the runtime sizes it for this config
    # (K + r, or the framework's peak); None where it is not fixed (dense, fractional, adaptive heads)
    capacity: int | None = None
    wall_s: float = 0.0
    reference: Reference | None = None
    # the stream's extra planted facts (Stream.extra_probes), each asked on a copy of the session:
    # {"retrieved", "logp", "text"} per probe
    extra_probes: list[dict] = field(default_factory=list)


def scored_targets(stream: Stream) -> list[int]:
    return [t for s in stream.segments if s.kind == "step" for t in s.ids]


def replay(
    engine,
    stream: Stream,
    config: CacheConfig,
    on_logits: Callable[[int, torch.Tensor, int], None],
    probe: bool = True,
    progress: Callable[[int], None] | None = None,
    reuse_prefix: bool = False,
    before_append: Callable[[object, int, list[int]], list[int]] | None = None,
) -> ReplayResult:
    """`on_logits(i, logits, target)` for the i-th scored token. Returns probe results and stats.
    `reuse_prefix`: a reprefill run's rebuilds start from the previous one's dense state
    (`Session.reuse_prefix`): the same logits, fewer forwards, so its time is not the protocol's.
    `before_append(session, stream_position, ids)`: the ids to append in the segment's place (after
    what it does to the session: observation masking, bench/masking.py)."""
    result = ReplayResult()
    session = engine.session(config)
    session.reuse_prefix = reuse_prefix
    starts, marked = stream.segment_starts, 0  # for a segment-aware policy; the others never read them
    caps = session.evictor.schedule.capacities()
    result.capacity = max(caps) if caps else None
    t0 = time.perf_counter()
    i = 0
    last: torch.Tensor | None = None
    pos = 0
    for seg in stream.segments:
        if seg.kind == "append":
            ids = list(seg.ids) if before_append is None else before_append(session, pos, list(seg.ids))
            marked = _mark(session, starts, marked, pos, pos + len(seg.ids), len(ids) - len(seg.ids))
            last = session.append(ids)
        else:
            marked = _mark(session, starts, marked, pos, pos + len(seg.ids), 0)
            # Teacher forcing: batched, but the same logits and rounds as one `step` per token.
            rows = session.teacher_force(list(seg.ids))
            for tok, logits in zip(seg.ids, [last, *rows[:-1]], strict=True):
                on_logits(i, logits, tok)
                i += 1
            last = rows[-1]
        result.memory.append((session.logical_length, session.stats.max_entries))
        pos += len(seg.ids)
        if progress:
            progress(len(seg.ids))
    if probe and stream.probe is not None:
        for extra in stream.extra_probes:  # each on a copy: the same cache the first probe reads
            branch = copy.deepcopy(session, {id(session.engine): session.engine})
            asked = ReplayResult()
            _probe(engine, branch, extra, asked)
            result.extra_probes.append(
                {"retrieved": asked.probe_retrieved, "logp": asked.probe_logp, "text": asked.probe_text}
            )
        _probe(engine, session, stream.probe, result)
    result.wall_s = time.perf_counter() - t0
    result.stats = session.stats.to_dict()
    return result


def _mark(session, starts: list[int], marked: int, lo: int, hi: int, ahead: int) -> int:
    """Mark the segment starts in stream [lo, hi) on the session before that segment is fed (a mark
    follows the history, so one set ahead would go stale under a masking re-send): they land `ahead`
    tokens (what the re-send puts first) past the session's end. Returns how many are marked."""
    base = session.logical_length + ahead - lo
    while marked < len(starts) and starts[marked] < hi:
        session.mark_segment(base + starts[marked])
        marked += 1
    return marked


def _probe(engine, session, p, result: ReplayResult) -> None:
    session.append(list(p.question))
    last = None
    for tok in p.prefix:
        last = session.step(tok)
    # The greedy branch runs on a copy so both branches start from the same cache (the engine and
    # its model are shared, not copied).
    branch = copy.deepcopy(session, {id(session.engine): session.engine})
    start = last
    logps = []
    for tok in p.value:
        logps.append(float(torch.log_softmax(last, -1)[tok]))
        last = session.step(tok)
    result.probe_logp = sum(logps) / len(logps)
    out = []
    logits = start
    for _ in range(PROBE_GREEDY_TOKENS):
        tok = int(torch.argmax(logits))
        if tok in engine.eos_token_ids:
            break
        out.append(tok)
        logits = branch.step(tok)
    text = engine.tokenizer.decode(out, skip_special_tokens=True)
    result.probe_text = text
    result.probe_retrieved = p.value_text in text


def reference_run(engine, stream: Stream, progress=None, topk: int = TOPK, probe: bool = True):
    """Replay with the full cache and keep what the comparisons need."""
    n = stream.n_scored
    k = min(topk, engine.model.config.vocab_size)
    ids = torch.zeros(n, k, dtype=torch.long)
    logp = torch.zeros(n, k)
    argmax = torch.zeros(n, dtype=torch.long)
    true = torch.zeros(n)

    def keep(i, logits, target):
        lp = torch.log_softmax(logits.float(), -1)
        v, j = torch.topk(lp, k)
        ids[i], logp[i], argmax[i], true[i] = j.cpu(), v.cpu(), j[0].cpu(), lp[target].cpu()

    res = replay(engine, stream, CacheConfig(policy="full"), keep, probe=probe, progress=progress)
    res.reference = Reference(ids=ids, logp=logp, argmax=argmax, logp_true=true)
    res.kl = [0.0] * n
    res.agree = [True] * n
    res.logp_true = true.tolist()
    return res


def compare(ref: Reference, logits: torch.Tensor, i: int, target: int) -> tuple[float, bool, float]:
    """KL(full || policy) on the reference's top-k tokens plus one tail bucket (a lower bound of the
    exact KL, equal to it when the tail is tiny), top-1 agreement, and log p of the true token."""
    lq = torch.log_softmax(logits.float(), -1).cpu()
    lp = ref.logp[i]
    lq_k = lq[ref.ids[i]]
    p = lp.exp()
    kl = float((p * (lp - lq_k)).sum())
    p_tail = max(0.0, 1.0 - float(p.sum()))
    if p_tail > 1e-9:
        q_tail = max(1e-30, 1.0 - float(lq_k.exp().sum()))
        kl += p_tail * (torch.log(torch.tensor(p_tail)) - torch.log(torch.tensor(q_tail))).item()
    return max(0.0, kl), int(torch.argmax(lq)) == int(ref.argmax[i]), float(lq[target])


def policy_run(engine, stream: Stream, config: CacheConfig, ref: Reference, progress=None, probe=True,
               reuse_prefix: bool = False, before_append=None):  # fmt: skip
    res_kl, res_agree, res_lp = [], [], []

    def cmp(i, logits, target):
        kl, agree, lp = compare(ref, logits, i, target)
        res_kl.append(kl)
        res_agree.append(agree)
        res_lp.append(lp)

    res = replay(engine, stream, config, cmp, probe=probe, progress=progress, reuse_prefix=reuse_prefix,
                 before_append=before_append)  # fmt: skip
    res.kl, res.agree, res.logp_true = res_kl, res_agree, res_lp
    return res
