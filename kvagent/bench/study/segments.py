"""The third claim (`kvagent bench study --claim segments`, docs/study.md "Claim 3"): at equal mean
KV entries, observation masking is at least as faithful to the full cache as the token-level
policies, in both protocols. Pre-registered: `SEGMENTS` below is the design as committed before any
result; the command line changes only the episodes file, the model, the device and the out dir.
`SEGMENTS_REPLICATION` (`--claim segments-replication`) is the second design, committed before its
run: the next eligible episodes after the first design's (held out from it), with the segment-aware
policy (runtime/policies/segments.py, over SnapKV's scores) as a second subject beside masking.

Per chosen episode: the full-cache reference, the masking run per mode (the full cache with the
older observations forgotten or re-rendered, bench/masking.py), then each token-level arm per mode
at its matched K: the block-rounded K whose predicted mean KV entries (the framework's rule: a
head grows to K + 2r and a round leaves K + r) is closest to the masking run's (exact: the same
masker replayed on a ledger, no model). Every record carries its measured `kv_mean`, reported
beside. Runs go through `run_fidelity` (resumable: a killed run restarts where it stopped)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from kvagent.bench.episodes import Episode, Probe
from kvagent.bench.fidelity import run_fidelity
from kvagent.bench.masking import HistorySpec, Masker
from kvagent.bench.stream import Stream
from kvagent.bench.study.run import clip_messages
from kvagent.bench.study.stats import _one_sided, holm, shift
from kvagent.runspec import RunSpec
from kvagent.runtime.budget import common_block

# The second planted fact: in the first reply (the first is in the first observation).
REPLY_FACT = Probe(
    question="Before you finish: what is the build tag you noted earlier in this session? Reply with the tag only.",
    answer_prefix="The build tag is",
    value="5182-KWZ",
)


@dataclass(frozen=True)
class SegmentsDesign:
    claim: str = "segments"
    keep: int = 3  # M: observations kept whole
    named: tuple[str, ...] = ("snapkv", "triattention", "random", "nexus")  # token-level arms
    modes: tuple[str, ...] = ("persistent", "reprefill")
    protect: str = "prompt"  # system prompt and issue: masking never touches them either
    buffer: int = 32
    window: int = 16
    framework: str = "recent-buffer"
    seed: int = 0
    clip_chars: int = 300
    clip_prompt_chars: int = 400
    max_tokens: int = 2048
    min_observations: int = 8
    n_episodes: int = 3
    skip: int = 0  # eligible episodes (file order) left to an earlier design: a replication's held-out rule
    # the arms tested against each token-level arm: masking, and "segments" (the segment-aware policy
    # at the same matched K, scoring with `scorer`; its segments are the replay's marks, from roles)
    subjects: tuple[str, ...] = ("masking",)
    scorer: str = "snapkv"
    margin: float = math.log(1.25)
    alpha: float = 0.05

    @property
    def history(self) -> str:
        return f"mask-observations={self.keep}"

    @property
    def family(self) -> int:
        return len(self.subjects) * len(self.named) * len(self.modes)


SEGMENTS = SegmentsDesign()
# The replication (docs/study.md, "Claim 3, replication"): the first design's rules on the next 4
# eligible episodes, the segments policy a second subject; Holm over 2 x 4 x 2 = 16.
SEGMENTS_REPLICATION = replace(
    SEGMENTS,
    claim="segments-replication",
    skip=SEGMENTS.n_episodes,
    n_episodes=4,
    subjects=("masking", "segments"),
)
DESIGNS = {d.claim: d for d in (SEGMENTS, SEGMENTS_REPLICATION)}


# ----------------------------------------------------------------------- episodes
def prepare(design: SegmentsDesign, episode: Episode) -> Episode:
    """Clipped as the design says, with the second fact planted at the end of the first reply."""
    ep = clip_messages(episode, design.clip_chars, design.clip_prompt_chars)
    if ep.probe is None:
        return ep
    msgs = [dict(m) for m in ep.messages]
    first = next(i for i, m in enumerate(msgs) if m["role"] == "assistant")
    msgs[first]["content"] = (
        f"{msgs[first]['content'].rstrip()}\n(Note to self: the build tag is {REPLY_FACT.value}.)"
    )
    return replace(ep, messages=msgs, extra_probes=(REPLY_FACT,))


def eligible(design: SegmentsDesign, stream: Stream) -> str | None:
    """Why the episode is not eligible (None: it is)."""
    n_obs = len(stream.observations)
    if n_obs < design.min_observations:
        return f"{n_obs} tool outputs in the first {len(stream.ids)} tokens < {design.min_observations}"
    if stream.probe is None or not stream.extra_probes:
        return "no planted facts (plant=0)"
    return None


def select(design: SegmentsDesign, streams: Sequence[Stream]) -> tuple[list[Stream], list[dict]]:
    rows = [{"name": s.name, "tokens": len(s.ids), "observations": len(s.observations),
             "reason": eligible(design, s)} for s in streams]  # fmt: skip
    ok = [s for s, r in zip(streams, rows, strict=True) if r["reason"] is None]
    earlier = {s.name for s in ok[: design.skip]}
    chosen = ok[design.skip : design.skip + design.n_episodes]
    names = {s.name for s in chosen}
    for r in rows:
        if r["reason"] is None and r["name"] in earlier:
            r["reason"] = "eligible, run by the earlier design (excluded: held-out episodes only)"
        elif r["reason"] is None and r["name"] not in names:
            r["reason"] = "eligible, held out (past the planned count)"
    return chosen, rows


# ----------------------------------------------------------------------- matching
class _Ledger:
    """What the masker does to a session's length, without a model."""

    def __init__(self, mode: str) -> None:
        self.config = type("C", (), {"mode": mode})()
        self.logical_length = 0
        self.forgotten = 0

    def forget(self, positions) -> int:
        self.forgotten += len(positions)
        return len(positions)

    def rewind(self, n: int) -> int:
        self.logical_length -= n
        return n


def _weighted(stream: Stream, entries: Sequence[int]) -> float:
    sizes = [len(s.ids) for s in stream.segments]
    return sum(n * e for n, e in zip(sizes, entries, strict=True)) / sum(sizes)


def masking_kv_mean(design: SegmentsDesign, stream: Stream, mode: str) -> float:
    """The masking run's mean KV entries (token-weighted over segments, as records' `kv_mean`)."""
    ledger, masker, pos, entries = _Ledger(mode), Masker(stream, design.keep), 0, []
    for seg in stream.segments:
        ids = list(seg.ids)
        if seg.kind == "append":
            ids = masker(ledger, pos, ids)
        ledger.logical_length += len(ids)
        pos += len(seg.ids)
        entries.append(ledger.logical_length - ledger.forgotten)
    return _weighted(stream, entries)


def token_kv_mean(stream: Stream, k: int, r: int) -> float:
    """A token-level run's predicted mean entries at K: the stream while it is under K + 2r, then a
    round every r tokens back to K + r."""

    def held(t: int) -> int:
        return t if t <= k + 2 * r else k + r + (t - k - 2 * r - 1) % r

    ends, pos = [], 0
    for seg in stream.segments:
        pos += len(seg.ids)
        ends.append(held(pos))
    return _weighted(stream, ends)


def matched_budget(design: SegmentsDesign, stream: Stream, mode: str) -> int:
    """The block-rounded K whose predicted mean entries is closest to the masking run's."""
    target, block = masking_kv_mean(design, stream, mode), common_block()
    ks = range(block, len(stream.ids) + block, block)
    return min(ks, key=lambda k: (abs(token_kv_mean(stream, k, design.buffer) - target), k))


def specs_for(design: SegmentsDesign, stream: Stream) -> list[RunSpec]:
    fixed = {"buffer": design.buffer, "window": design.window, "seed": design.seed}
    out: list[RunSpec] = [RunSpec("full", **fixed)]
    for mode in design.modes:
        out.append(HistorySpec("full", mode=mode, history=design.history, **fixed))
        k = matched_budget(design, stream, mode)
        evicting = {
            "mode": mode,
            "budget": k,
            "protect": design.protect,
            "framework": design.framework,
            **fixed,
        }
        if "segments" in design.subjects:  # the same K: the framework's rule does not read the scores
            out.append(HistorySpec("segments", policy_args={"scorer": design.scorer}, **evicting))
        out += [HistorySpec(p, **evicting) for p in design.named]
    return out


def run_segments(engine, streams: Sequence[Stream], design: SegmentsDesign, out_dir, model_name: str,
                 progress=None) -> list[dict]:  # fmt: skip
    """Run (or resume) the design on the chosen streams; their records."""
    return run_fidelity(engine, streams, lambda st: specs_for(design, st), out_dir, model_name,
                        progress=progress, plot=False)  # fmt: skip


# ----------------------------------------------------------------------- analysis
def arm_of(design: SegmentsDesign, r: Mapping) -> str | None:
    if r.get("history") == design.history and r.get("policy") == "full":
        return "masking"
    if r.get("policy") in design.named and not r.get("history"):
        return r["policy"]
    if (
        "segments" in design.subjects
        and r.get("policy") == "segments"
        and not r.get("history")
        and (r.get("policy_args") or {}).get("scorer", "snapkv") == design.scorer
    ):
        return "segments"
    return None


def _verdict(rows: Sequence[Mapping]) -> str:
    if all(r["outcome"] in ("better", "non-inferior") for r in rows):
        return "supported"
    if any(r["outcome"] == "worse beyond the margin" for r in rows):
        return "contradicted"
    return "inconclusive"


def _contrast(cell: Mapping, subject: str, base: str, mode: str, chosen: Sequence[str]) -> list[float]:
    pairs = [(cell[(subject, mode, e)], cell[(base, mode, e)]) for e in chosen
             if (subject, mode, e) in cell and (base, mode, e) in cell]  # fmt: skip
    return [math.log(max(a["kl"], 1e-12) / max(b["kl"], 1e-12)) for a, b in pairs]


def analyse(records: Sequence[Mapping], design: SegmentsDesign, chosen: Sequence[str]) -> dict:
    """Per (arm, mode, episode) KL, top-1, kv_mean and both probes; per (subject, baseline, mode) the
    contrast d = log(KL_subject / KL_baseline), its tests, Holm over the whole family (every subject),
    the verdict (and each subject's, by the same rule over its rows); masking vs segments, per mode,
    secondary (uncorrected, no verdict)."""
    cell: dict[tuple[str, str, str], Mapping] = {}
    for r in records:
        arm = arm_of(design, r)
        if arm is not None and r.get("episode") in chosen and r.get("status") == "ok":
            cell[(arm, r["mode"], r["episode"])] = r
    rows, tests = [], []
    for subject in design.subjects:
        for mode in design.modes:
            for base in design.named:
                d = _contrast(cell, subject, base, mode, chosen)
                s = shift(d, design.margin)
                # non-inferior: H0 mu >= +margin (the subject worse by more than the factor) rejected
                p_nonin = _one_sided(np.asarray(d, dtype=float), design.margin, "less")
                rows.append({"subject": subject, "baseline": base, "mode": mode, "n": len(d), "d": d,
                             "ratio": math.exp(s.mean) if d else None, "lo95": s.lo95, "hi95": s.hi95,
                             "p_noninferior": p_nonin, "p_better": s.p_below, "p_worse": s.p_beyond_above})  # fmt: skip
                tests.append(rows[-1])
    for key, out in (
        ("p_noninferior", "holm_noninferior"),
        ("p_better", "holm_better"),
        ("p_worse", "holm_worse"),
    ):
        for row, p in zip(tests, holm([t[key] for t in tests]), strict=True):
            row[out] = p
    complete = all(row["n"] == len(chosen) for row in rows) and len(chosen) == design.n_episodes
    for row in rows:
        row["outcome"] = (
            "better" if row["holm_better"] < design.alpha
            else "non-inferior" if row["holm_noninferior"] < design.alpha
            else "worse beyond the margin" if row["holm_worse"] < design.alpha
            else "undecided"
        )  # fmt: skip
    interim = "none yet (interim: the family has not run on every chosen episode)"
    verdict = _verdict(rows) if complete else interim
    by_subject = {sub: _verdict([r for r in rows if r["subject"] == sub]) if complete else interim
                  for sub in design.subjects}  # fmt: skip
    secondary = []
    if "segments" in design.subjects:
        for mode in design.modes:
            d = _contrast(cell, "masking", "segments", mode, chosen)
            s = shift(d, design.margin)
            secondary.append({"subject": "masking", "baseline": "segments", "mode": mode, "n": len(d), "d": d,
                              "ratio": math.exp(s.mean) if d else None, "lo95": s.lo95, "hi95": s.hi95,
                              "p_better": s.p_below, "p_worse": s.p_above})  # fmt: skip
    return {"rows": rows, "cells": {"|".join(k): _summary(v) for k, v in cell.items()}, "verdict": verdict,
            "by_subject": by_subject, "secondary": secondary, "chosen": list(chosen)}  # fmt: skip


def _summary(r: Mapping) -> dict:
    extra = (r.get("extra_probes") or [{}])[0]
    return {"kl": r["kl"], "top1": r["top1"], "kv_mean": r.get("kv_mean"), "budget": r.get("budget"),
            "fact_obs": r.get("probe_retrieved"), "fact_obs_logp": r.get("probe_logp"),
            "fact_reply": extra.get("retrieved"), "fact_reply_logp": extra.get("logp")}  # fmt: skip


def report_markdown(result: Mapping, design: SegmentsDesign, rows: Sequence[Mapping]) -> str:
    """The claim's report: the verdict, the family's table, each episode's cells, the selection."""

    def f(x, spec=".3f"):
        return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)

    title = "observation masking" + (" and the segments policy" if "segments" in design.subjects else "")
    out = [f"# Claim 3 ({design.claim}): {title} vs token-level eviction at equal mean KV (M = {design.keep})", "",
           f"**Verdict: {result['verdict']}**", ""]  # fmt: skip
    if len(design.subjects) > 1:
        out += [f"- {sub}: {v}" for sub, v in result.get("by_subject", {}).items()] + [""]
    out += [f"Holm over the {design.family} rows below (alpha {design.alpha}, margin {math.exp(design.margin):.2f}).", "",
            "| subject | baseline | mode | n | KL ratio subject/baseline [95% CI] | Holm p non-inferior | "
            "Holm p better | Holm p worse | outcome |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in result["rows"]:
        ci = f"[{f(math.exp(r['lo95']))}, {f(math.exp(r['hi95']))}]" if r["n"] > 1 else ""
        out.append(f"| {r.get('subject', 'masking')} | {r['baseline']} | {r['mode']} | {r['n']} | {f(r['ratio'])} {ci} | "
                   f"{f(r['holm_noninferior'])} | {f(r['holm_better'])} | {f(r['holm_worse'])} | {r['outcome']} |")  # fmt: skip
    if result.get("secondary"):
        out += ["", "Secondary (uncorrected, no verdict): masking vs the segments policy.", "",
                "| mode | n | KL ratio masking/segments [95% CI] | p lower (one-sided) | p higher (one-sided) |",
                "|---|---|---|---|---|"]  # fmt: skip
        for r in result["secondary"]:
            ci = f"[{f(math.exp(r['lo95']))}, {f(math.exp(r['hi95']))}]" if r["n"] > 1 else ""
            out.append(
                f"| {r['mode']} | {r['n']} | {f(r['ratio'])} {ci} | {f(r['p_better'])} | {f(r['p_worse'])} |"
            )
    out += ["", "Per episode (KL, top-1, measured mean KV entries, K; the fact in the first observation / "
            "in the first reply: retrieved by the greedy answer):", "",
            "| episode | mode | arm | K | mean KV | KL | top-1 | fact (obs) | fact (reply) |",
            "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for key, c in sorted(result["cells"].items(), key=lambda kv: (kv[0].split("|")[2], kv[0].split("|")[1])):
        arm, mode, ep = key.split("|")
        out.append(f"| {ep} | {mode} | {arm} | {c['budget'] or 'dense'} | {f(c['kv_mean'], '.0f')} | "
                   f"{f(c['kl'], '.4f')} | {f(c['top1'])} | {c['fact_obs']} | {c['fact_reply']} |")  # fmt: skip
    out += [
        "",
        "Episodes looked at:",
        "",
        "| episode | tokens | tool outputs | chosen / why not |",
        "|---|---|---|---|",
    ]
    out += [
        f"| {r['name']} | {r['tokens']} | {r['observations']} | {r['reason'] or 'chosen'} |" for r in rows
    ]
    return "\n".join(out) + "\n"
