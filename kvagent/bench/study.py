"""`kvagent bench study`: the fidelity bench as a study of the two seed papers' claims.

The grid: every policy x mode x budget (a fraction of each episode's length, turned into a fixed
K for that episode) x seed (for the policies that draw at random), with protect=sink; plus a
protection ablation (none / sink / prompt) at one budget. Each record also carries the per-token
scores by position bucket, for the margin-vs-context-length question. Runs go through
`run_fidelity` (resumable, batched when asked); `kvagent.bench.study_report` turns the records
into tables, plots and verdicts."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from kvagent.bench import replay as rp
from kvagent.bench.episodes import Episode
from kvagent.bench.fidelity import load_records, pending_runs, run_fidelity
from kvagent.bench.stream import Stream
from kvagent.errors import ConfigError
from kvagent.runspec import RunSpec, sweep
from kvagent.runtime.budget import common_block

# Policies whose keep-set depends on the session seed; they run once per seed and are averaged
# per episode. Every other policy is deterministic given the episode.
RANDOM_DRAW = ("random", "nexus")
PROTECT_MAIN = "sink"


@dataclass(frozen=True)
class StudyPlan:
    policies: tuple[str, ...]
    modes: tuple[str, ...] = ("persistent", "reprefill")
    fractions: tuple[float, ...] = (0.1, 0.2, 0.4)
    seeds: tuple[int, ...] = (0, 1, 2)
    ablation_fraction: float = 0.2
    ablation_protects: tuple[str, ...] = ("none", "sink", "prompt")
    ablation_policies: tuple[str, ...] | None = None  # None: every policy
    buffer: int = 128
    window: int = 16
    bucket: int = 512  # tokens per position bucket
    policy_args: dict = field(default_factory=dict)

    def __post_init__(self):
        for f in (*self.fractions, self.ablation_fraction):
            if isinstance(f, bool) or not isinstance(f, float) or not 0 < f < 1:
                raise ConfigError(
                    f"budgets: the study's budgets are fractions in (0,1) of each episode, got {f!r}"
                )
        if not self.seeds:
            raise ConfigError("seeds: got none; pass e.g. --seeds 0,1,2")
        if self.bucket < 1:
            raise ConfigError(f"bucket: must be >= 1 token, got {self.bucket}")
        evicting = [p for p in self.policies if p != "full"]
        if not evicting:
            raise ConfigError("policies: the study needs at least one evicting policy (not only `full`)")
        unknown = set(self.ablation_policies or ()) - set(evicting)
        if unknown:
            raise ConfigError(f"ablation-policies: {', '.join(sorted(unknown))} not among --policies")

    @property
    def evicting(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p for p in self.policies if p != "full"))

    def seeds_of(self, policy: str) -> tuple[int, ...]:
        return self.seeds if policy in RANDOM_DRAW else (self.seeds[0],)


def budget_for(fraction: float, tokens: int) -> int:
    """The fixed K of a fraction of an episode of `tokens` tokens: rounded to the block every
    policy accepts, at least one block."""
    block = common_block()
    return max(block, round(fraction * tokens / block) * block)


def template_grid(plan: StudyPlan) -> list[RunSpec]:
    """The specs with fractional budgets (checked once, before any run); `specs_for` makes them
    per-episode K. Ordered by what the claims need first (runs go in this order, so a study cut
    short has whole settings): per mode (in the order given) the main grid and the ablation with
    the first seed, then the other seeds of the random-draw policies."""
    fixed = dict(buffer=plan.buffer, window=plan.window, policy_args=plan.policy_args)
    first, rest = plan.seeds[:1], plan.seeds[1:]
    ablation = plan.ablation_policies or plan.evicting
    rand = [p for p in plan.evicting if p in RANDOM_DRAW]
    specs = [RunSpec("full", buffer=plan.buffer, window=plan.window, seed=plan.seeds[0])]
    for mode in plan.modes:
        for f in plan.fractions:
            specs += sweep(plan.evicting, [mode], [f], first, protects=[PROTECT_MAIN], **fixed)
        specs += sweep(ablation, [mode], [plan.ablation_fraction], first, protects=plan.ablation_protects,
                       **fixed)  # fmt: skip
    if rest and rand:
        specs += sweep(rand, plan.modes, plan.fractions, rest, protects=[PROTECT_MAIN], **fixed)
        abl_rand = [p for p in ablation if p in RANDOM_DRAW]
        if abl_rand:
            specs += sweep(abl_rand, plan.modes, [plan.ablation_fraction], rest, protects=plan.ablation_protects,
                           **fixed)  # fmt: skip
    return list(dict.fromkeys(specs))


def specs_for(plan: StudyPlan, stream: Stream) -> list[RunSpec]:
    n = len(stream.ids)
    out = [s if s.budget is None else replace(s, budget=budget_for(s.budget, n)) for s in template_grid(plan)]
    return list(dict.fromkeys(out))


def fraction_of(record: dict, fractions: Sequence[float]) -> list[float]:
    """The plan's fractions whose K for this record's episode is the record's budget (several when
    an episode is short enough for two fractions to round to the same K)."""
    b = record.get("budget")
    if b is None:
        return []
    return [f for f in fractions if budget_for(f, int(record["tokens"])) == b]


def clip_messages(episode: Episode, chars: int) -> Episode:
    """Each message longer than `chars` keeps its first and last `chars // 2` characters around a
    marker, as agent scaffolds cut long tool output. Keeps more turns inside a token cut on a CPU,
    and the planted fact (at the end of its observation) survives."""
    if chars < 20:
        raise ConfigError(f"clip-chars: must be >= 20, got {chars}")
    half = chars // 2
    msgs = []
    for m in episode.messages:
        c = m["content"]
        if len(c) > chars:
            c = f"{c[:half]}\n[... {len(c) - 2 * half} characters cut ...]\n{c[-half:]}"
        msgs.append({**m, "content": c})
    return replace(episode, messages=msgs)


# ----------------------------------------------------------------------- position buckets
def scored_positions(stream: Stream) -> list[int]:
    """The stream position of each scored (teacher-forced assistant) token, in scoring order."""
    out, pos = [], 0
    for seg in stream.segments:
        if seg.kind == "step":
            out.extend(range(pos, pos + len(seg.ids)))
        pos += len(seg.ids)
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
def replay_tokens(stream: Stream, spec: RunSpec) -> int:
    """Tokens one run pushes through the model: the stream once (and the probe), plus in reprefill
    mode the whole history again at every appended chunk after the first."""
    probe = (
        len(stream.probe.question) + len(stream.probe.prefix) + len(stream.probe.value) if stream.probe else 0
    )
    n = len(stream.ids) + probe
    if spec.mode == "reprefill" and spec.policy != "full":
        pos = 0
        for i, seg in enumerate(stream.segments):
            if seg.kind == "append" and i > 0:
                n += pos
            pos += len(seg.ids)
        if stream.probe:
            n += pos
    return n


@dataclass(frozen=True)
class Estimate:
    runs: int
    done: int
    skipped: int
    tokens: int
    seconds_per_token: float  # measured: one full-cache replay's wall time per token

    @property
    def seconds(self) -> float:
        # Eviction rounds cost extra over the full-cache replay the rate was measured on.
        return EVICTION_OVERHEAD * self.tokens * self.seconds_per_token


EVICTION_OVERHEAD = 1.3


def estimate(engine, streams: Sequence[Stream], plan: StudyPlan, out_dir: str | Path, model_name: str,
             refs: dict[str, rp.ReplayResult]) -> Estimate:  # fmt: skip
    """Time the first pending episode's full-cache replay (kept in `refs`, so `run_study` does not
    run it again) and scale by the tokens every pending run replays."""
    records = load_records(Path(out_dir))
    todo, skipped = pending_runs(engine, streams, lambda st: specs_for(plan, st), records, model_name)
    total = sum(len(specs_for(plan, st)) for st in streams) - len(skipped)
    if not todo:
        return Estimate(total, total, len(skipped), 0, 0.0)
    first = todo[0][0]
    t0 = time.perf_counter()
    refs[first.digest()] = rp.reference_run(engine, first)
    spt = (time.perf_counter() - t0) / replay_tokens(first, RunSpec("full"))
    pending_refs = {st.digest(): st for st, _ in todo if st.digest() not in refs}
    tokens = sum(replay_tokens(st, s) for st, s in todo if s.policy != "full")
    tokens += sum(replay_tokens(st, RunSpec("full")) for st in pending_refs.values())
    return Estimate(total, total - len(todo), len(skipped), tokens, spt)


def run_study(engine, streams: Sequence[Stream], plan: StudyPlan, out_dir: str | Path, model_name: str,
              progress=None, concurrency: int = 1, refs: dict | None = None) -> list[dict]:  # fmt: skip
    """Run (or resume) the study's grid; returns the records of these episodes and this model."""
    if not streams:
        raise ConfigError("episodes: the study got no episode")
    names = [s.name for s in streams]
    if len(set(names)) != len(names):
        raise ConfigError("episodes: two episodes share a name; the study pairs policies by episode name")
    return run_fidelity(
        engine,
        streams,
        lambda st: specs_for(plan, st),
        out_dir,
        model_name,
        progress=progress,
        plot=False,
        annotate=lambda st, res: {"positions": position_buckets(st, res, plan.bucket)},
        concurrency=concurrency,
        refs=refs,
    )
