"""`kvagent bench study --claim NAME`: one pre-registered design (`kvagent.bench.study.design`) run
as fidelity replays, resumable.

Per chosen episode: the full-cache reference, then every arm x mode x budget (a fraction of the
episode, turned into a fixed K) x seed (seeded arms only) of the design, in the order its tests need
them (the primary family first), so a study cut short has whole settings over every episode. Each
record also carries its scores by position (fine buckets) and what the analysis needs to find the
first eviction. `kvagent.bench.study.analysis` turns the records into the pre-registered tests."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from kvagent.bench import replay as rp
from kvagent.bench.episodes import Episode
from kvagent.bench.fidelity import load_records, pending_runs, run_fidelity
from kvagent.bench.reference_cache import cached_reference, reference_path
from kvagent.bench.stream import Stream
from kvagent.bench.study.design import Arm, Design, budget_for
from kvagent.errors import ConfigError
from kvagent.fileio import atomic_write_json
from kvagent.runspec import RunSpec, sweep

__all__ = ["budget_for", "run_study", "estimate", "specs_for", "template_grid"]

DESIGN_FILE = "design.json"  # which design an out dir holds


def fixed_settings(design: Design) -> dict:
    """The cache settings every run of the design shares (r, W, framework)."""
    return dict(design.fixed)


# ----------------------------------------------------------------------- the grid
def _specs(design: Design, arms: Sequence[Arm], modes: Sequence[str], seeds: str) -> list[RunSpec]:
    out: list[RunSpec] = []
    for mode in modes:
        for f in design.fractions:
            for arm in arms:
                if mode not in design.modes_of(arm) or f not in design.fractions_of(arm):
                    continue
                chosen = design.seeds_of(arm)
                chosen = chosen[:1] if seeds == "first" else chosen[1:] if seeds == "rest" else chosen
                out += sweep([arm.policy], [mode], [f], chosen, protects=[arm.protect],
                             policy_args={arm.policy: dict(arm.policy_args)}, **fixed_settings(design))  # fmt: skip
    return out


def template_grid(design: Design) -> list[RunSpec]:
    """The design's specs with fractional budgets, checked once before any run (`specs_for` makes
    them per-episode K), in run order: the primary family (subject and named baselines in the
    primary modes, first seed), the subject's other seeds, the subject and named baselines in the
    other modes, the other arms, the ablations."""
    subject = [design.arm(design.subject)]
    named = [design.arm(n) for n in design.named]
    ablation = {a for pair in design.ablations for a in pair} - {design.subject, *design.named}
    others = [a for a in design.arms if a.name not in {design.subject, *design.named, *ablation}]
    rest_modes = [m for m in design.modes if m not in design.primary_modes]
    fixed = fixed_settings(design)
    specs = [RunSpec("full", **fixed, seed=design.seeds[0])]
    specs += _specs(design, subject + named, design.primary_modes, "first")
    specs += _specs(design, subject, design.primary_modes, "rest")
    specs += _specs(design, subject + named, rest_modes, "all")
    specs += _specs(design, others, design.modes, "all")
    specs += _specs(design, [a for a in design.arms if a.name in ablation], design.modes, "all")
    return list(dict.fromkeys(specs))


def specs_for(design: Design, stream: Stream) -> list[RunSpec]:
    n = len(stream.ids)
    out = [
        s if s.budget is None else replace(s, budget=budget_for(s.budget, n)) for s in template_grid(design)
    ]
    return list(dict.fromkeys(out))


def clip_messages(episode: Episode, chars: int | None, prompt_chars: int | None | str = "same") -> Episode:
    """Each message longer than its limit keeps the first and last halves of it around a marker, as
    agent scaffolds cut long tool output: `chars` for every message, or, given `prompt_chars`, that
    for the messages before the first reply (the prompt) and `chars` for the rest (None: that part
    whole). More turns fit a token cut on a CPU, a short prompt is a minority of K, and the planted
    fact (at the end of its observation) survives."""
    prompt_limit = chars if prompt_chars == "same" else prompt_chars
    for name, limit in (("clip-chars", chars), ("clip-prompt-chars", prompt_limit)):
        if limit is not None and limit < 20:
            raise ConfigError(f"{name}: must be >= 20, got {limit}")
    msgs, replied = [], False
    for m in episode.messages:
        replied = replied or m["role"] == "assistant"
        limit = chars if replied else prompt_limit
        c = m["content"]
        if limit is not None and len(c) > limit:
            half = limit // 2
            c = f"{c[:half]}\n[... {len(c) - 2 * half} characters cut ...]\n{c[-half:]}"
        msgs.append({**m, "content": c})
    return replace(episode, messages=msgs)


def prepare(design: Design, episode: Episode) -> Episode:
    """The episode as the design replays it (clipped as it says)."""
    if design.clip_chars is None and design.clip_prompt_chars is None:
        return episode
    return clip_messages(episode, design.clip_chars, design.clip_prompt_chars)


# ----------------------------------------------------------------------- position buckets
def scored_positions(stream: Stream) -> list[int]:
    """The stream position of each scored (teacher-forced assistant) token, in scoring order."""
    out, pos = [], 0
    for seg in stream.segments:
        if seg.kind == "step":
            out.extend(range(pos, pos + len(seg.ids)))
        pos += len(seg.ids)
    return out


def append_ends(stream: Stream) -> list[int]:
    """The stream length after each appended (not scored) segment: where reprefill compresses."""
    out, pos = [], 0
    for seg in stream.segments:
        pos += len(seg.ids)
        if seg.kind == "append":
            out.append(pos)
    return out


def position_buckets(stream: Stream, res: rp.ReplayResult, bucket: int) -> list[list[float]]:
    """[start, n, mean KL, top-1 agreement, mean log p(true)] per `bucket`-token span of the
    stream that holds scored tokens."""
    acc: dict[int, list[float]] = {}
    for pos, kl, agree, lp in zip(scored_positions(stream), res.kl, res.agree, res.logp_true, strict=False):
        a = acc.setdefault(pos // bucket * bucket, [0, 0.0, 0.0, 0.0])
        a[0] += 1
        a[1] += kl
        a[2] += float(agree)
        a[3] += lp
    return [[start, n, s_kl / n, s_a / n, s_lp / n] for start, (n, s_kl, s_a, s_lp) in sorted(acc.items())]


# ----------------------------------------------------------------------- cost
def replay_tokens(stream: Stream, spec: RunSpec, reuse_prefix: bool = True) -> int:
    """Tokens one run pushes through the model: the stream once (and the probe), plus in reprefill
    mode, at every appended chunk after the first, the history again: from where the previous
    rebuild's kept dense state ends (its last whole chunk) with `reuse_prefix`, else all of it."""
    probe = (
        len(stream.probe.question) + len(stream.probe.prefix) + len(stream.probe.value) if stream.probe else 0
    )
    n = len(stream.ids) + probe
    if spec.mode == "reprefill" and spec.policy != "full":
        chunk = spec.cache_config().prefill_chunk if reuse_prefix else None
        pos = kept = 0
        for i, seg in enumerate(stream.segments):
            if seg.kind == "append":
                n += pos - kept if i > 0 else 0
                kept = (pos + len(seg.ids)) // chunk * chunk if chunk else 0
            pos += len(seg.ids)
        if stream.probe:
            n += pos - kept
    return n


class Estimate:
    # Eviction rounds cost extra over the full-cache replay the rate was measured on.
    OVERHEAD = 1.3

    def __init__(self, runs: int, done: int, skipped: int, tokens: int, seconds_per_token: float):
        self.runs, self.done, self.skipped = runs, done, skipped
        self.tokens, self.seconds_per_token = tokens, seconds_per_token

    @property
    def seconds(self) -> float:
        return self.OVERHEAD * self.tokens * self.seconds_per_token


def estimate(engine, streams: Sequence[Stream], design: Design, out_dir: str | Path, model_name: str,
             refs: dict[str, rp.ReplayResult], reuse_prefix: bool = True) -> Estimate:  # fmt: skip
    """Time the first pending episode's full-cache replay (kept in `refs`, so `run_study` does not
    run it again) and scale by the tokens every pending run replays."""
    records = load_records(Path(out_dir))
    todo, skipped = pending_runs(engine, streams, lambda st: specs_for(design, st), records, model_name)
    total = sum(len(specs_for(design, st)) for st in streams) - len(skipped)
    if not todo:
        return Estimate(total, total, len(skipped), 0, 0.0)
    first = next((st for st, _ in todo if st.digest() in refs), None) or _time_one(
        engine, [st for st, _ in todo], Path(out_dir), model_name, refs
    )
    spt = refs[first.digest()].wall_s / replay_tokens(first, RunSpec("full"))
    pending_refs = {
        st.digest(): st
        for st, _ in todo
        if st.digest() not in refs and not reference_path(Path(out_dir), engine, st, model_name).exists()
    }
    tokens = sum(replay_tokens(st, s, reuse_prefix) for st, s in todo if s.policy != "full")
    tokens += sum(replay_tokens(st, RunSpec("full")) for st in pending_refs.values())
    return Estimate(total, total - len(todo), len(skipped), tokens, spt)


def _time_one(engine, streams: list[Stream], out_dir: Path, model_name: str, refs: dict) -> Stream:
    """The first stream whose reference is stored or free to replay (another process on this out
    dir may be replaying the first ones), put in `refs`; if all are held, the first, waited for."""
    for st in dict.fromkeys(streams):
        res = cached_reference(engine, st, out_dir, model_name, wait=False)
        if res is not None:
            refs[st.digest()] = res
            return st
    refs[streams[0].digest()] = cached_reference(engine, streams[0], out_dir, model_name)
    return streams[0]


# ----------------------------------------------------------------------- resuming
def check_resume(design: Design, out_dir: Path, model_name: str) -> None:
    """Refuse an out dir that holds another design's runs, or runs whose buffer, window or
    framework differ from this design's: run ids do not show them, so they would mix."""
    marker = out_dir / DESIGN_FILE
    if marker.exists():
        import json

        try:
            claim = json.loads(marker.read_text(encoding="utf-8")).get("claim")
        except (json.JSONDecodeError, AttributeError):
            raise ConfigError(
                f"out: {marker} is not valid JSON; move it away or pass another --out"
            ) from None
        if claim != design.claim:
            raise ConfigError(
                f"out: {out_dir} holds the {claim} study; pass another --out for --claim {design.claim}"
            )
    want = (design.buffer, design.window, design.framework)
    for r in load_records(out_dir):
        if r.get("status") != "ok" or r.get("model") != model_name:
            continue
        spec = RunSpec.from_record(r)  # a field the record lacks: what it ran with (framework: topk-all)
        got = (spec.buffer, spec.window, spec.framework if spec.evicts else design.framework)
        if got != want:
            raise ConfigError(
                f"out: {out_dir} holds runs with r={got[0]}, W={got[1]}, framework={got[2]} but the "
                f"{design.claim} design runs r={want[0]}, W={want[1]}, framework={want[2]}; pass another --out "
                "(a study directory never mixes them)"
            )


def save_selection(out_dir: Path, design: Design, chosen: Sequence[Stream], rows: Sequence) -> None:
    """Which episodes the design chose and why the others were not (`--report-only` reads it back)."""
    names = {s.name for s in chosen}
    not_chosen = [{"name": e.name, "reason": e.reason or "eligible, past the planned count"}
                  for e in rows if e.name not in names]  # fmt: skip
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out_dir / DESIGN_FILE, {"claim": design.claim, **fixed_settings(design),
                                              "chosen": [s.name for s in chosen], "not_chosen": not_chosen})  # fmt: skip


def load_selection(out_dir: Path) -> tuple[list[str] | None, list[dict]]:
    import json

    marker = out_dir / DESIGN_FILE
    if not marker.exists():
        return None, []
    data = json.loads(marker.read_text(encoding="utf-8"))
    return data.get("chosen"), list(data.get("not_chosen") or [])


def run_study(engine, streams: Sequence[Stream], design: Design, out_dir: str | Path, model_name: str,
              progress=None, concurrency: int = 1, refs: dict | None = None,
              reuse_prefix: bool = True) -> list[dict]:  # fmt: skip
    """Run (or resume) the design on `streams` (already chosen); returns their records."""
    if not streams:
        raise ConfigError(f"episodes: none is eligible for the {design.claim} design")
    out = Path(out_dir)
    check_resume(design, out, model_name)
    if not (out / DESIGN_FILE).exists():
        save_selection(out, design, streams, [])
    n_layers = engine.n_layers

    def annotate(st: Stream, res: rp.ReplayResult) -> dict:
        return {"positions": position_buckets(st, res, design.fine_bucket), "n_layers": n_layers,
                "append_ends": append_ends(st)}  # fmt: skip

    return run_fidelity(
        engine,
        streams,
        lambda st: specs_for(design, st),
        out,
        model_name,
        progress=progress,
        plot=False,
        annotate=annotate,
        concurrency=concurrency,
        refs=refs,
        reuse_prefix=reuse_prefix,
    )
