"""The study's two pre-registered designs (docs/study.md, "Design"), one per seed paper's claim.

A design fixes everything a result depends on before any run: which episodes (a rule applied to any
trajectory file, and how many, from the power calculation), where they are cut, the budgets, the
eviction framework, buffer and window, each arm (policy, protection, options, seeds), the primary
contrasts with their margin, test and family for Holm's correction. `kvagent bench study --claim
NAME` runs `DESIGNS[NAME]` unchanged; nothing on the command line changes what it tests."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kvagent.bench.stream import Stream
from kvagent.bench.study.power import PowerPlan, plan_power
from kvagent.errors import ConfigError
from kvagent.runtime.budget import common_block

# The papers' eviction framework (issue #26): the newest r entries are never candidates.
FRAMEWORK = "recent-buffer"


@dataclass(frozen=True)
class Arm:
    """One policy setting of a design: `name` is how tables show it."""

    name: str
    policy: str
    protect: str
    policy_args: Mapping = field(default_factory=dict)
    seeded: bool = False  # its keep-set is a random draw: run once per design seed, averaged per episode
    modes: tuple[str, ...] | None = None  # None: every mode of the design
    fractions: tuple[float, ...] | None = None  # None: every budget of the design

    def matches(self, record: Mapping) -> bool:
        return (
            record.get("policy") == self.policy
            and record.get("protect") == self.protect
            and dict(record.get("policy_args") or {}) == dict(self.policy_args)
        )


@dataclass(frozen=True)
class Design:
    claim: str
    title: str
    statement: str  # the claim as tested, one sentence
    subject: str  # the arm the claim is about
    named: tuple[str, ...]  # the primary family's baselines (Holm over named x primary modes x fractions)
    arms: tuple[Arm, ...]
    modes: tuple[str, ...]
    primary_modes: tuple[str, ...]
    fractions: tuple[float, ...]  # K = fraction x the episode's tokens, fixed per episode
    test: str  # "equivalence" (TOST) | "superiority" (one-sided)
    buffer: int  # r
    window: int  # W
    framework: str
    seeds: tuple[int, ...]
    clip_chars: int | None  # each later message cut to its head and tail (None: whole messages)
    clip_prompt_chars: int | None  # each message of the prompt (before the first reply), likewise
    max_tokens: int  # cut at whole turns
    min_turns: int
    min_tokens: int
    max_prompt_share: float | None  # eligible only if prompt <= share x K (None: no rule)
    pilot_sd: float  # assumed SD of the per-episode log ratio, for the power calculation
    pilot: str  # where pilot_sd comes from
    margin: float = math.log(1.25)
    alpha: float = 0.05
    power_target: float = 0.8
    ablations: tuple[tuple[str, str], ...] = ()  # (arm, reference arm), reported, outside the family
    trend_against: str | None = None  # the baseline whose margin's trend with position is tested
    fine_bucket: int = 32  # tokens per stored position bucket (trends start at the first eviction)
    shown_bucket: int = 1024  # tokens per bucket of the margin-by-position table and plot

    def __post_init__(self):
        names = [a.name for a in self.arms]
        if len(set(names)) != len(names):
            raise ConfigError(f"design {self.claim}: two arms share a name")
        keys = [(a.policy, a.protect, tuple(sorted(a.policy_args.items()))) for a in self.arms]
        if len(set(keys)) != len(keys):
            raise ConfigError(f"design {self.claim}: two arms run the same setting")
        for n in (self.subject, *self.named, *(x for ab in self.ablations for x in ab)):
            if n not in names:
                raise ConfigError(f"design {self.claim}: {n!r} is not one of its arms")
        if self.test not in ("equivalence", "superiority"):
            raise ConfigError(f"design {self.claim}: test must be equivalence or superiority")

    def arm(self, name: str) -> Arm:
        return next(a for a in self.arms if a.name == name)

    def arm_of(self, record: Mapping) -> Arm | None:
        return next((a for a in self.arms if a.matches(record)), None)

    def modes_of(self, arm: Arm) -> tuple[str, ...]:
        return arm.modes or self.modes

    def fractions_of(self, arm: Arm) -> tuple[float, ...]:
        return arm.fractions or self.fractions

    def seeds_of(self, arm: Arm) -> tuple[int, ...]:
        return self.seeds if arm.seeded else self.seeds[:1]

    @property
    def family(self) -> int:
        return len(self.named) * len(self.primary_modes) * len(self.fractions)

    def power_plan(self) -> PowerPlan:
        test = "equivalence" if self.test == "equivalence" else "one-sided"
        return plan_power(test, self.pilot_sd, self.margin, self.alpha, self.family, self.power_target)

    @property
    def n_episodes(self) -> int:
        return self.power_plan().needed

    @property
    def fixed(self) -> dict:
        """The cache settings every run of the design shares."""
        return {"buffer": self.buffer, "window": self.window, "framework": self.framework}


def budget_for(fraction: float, tokens: int) -> int:
    """The fixed K of a fraction of an episode of `tokens` tokens: rounded to the block every
    policy accepts, at least one block."""
    block = common_block()
    return max(block, round(fraction * tokens / block) * block)


@dataclass(frozen=True)
class Eligibility:
    name: str
    tokens: int
    prompt: int
    turns: int
    scored: int
    k_min: int  # K at the design's smallest budget
    reason: str | None  # why the episode is not eligible (None: it is)


def eligibility(design: Design, stream: Stream) -> Eligibility:
    n, p, turns = len(stream.ids), stream.prompt_length, stream.n_turns
    k = budget_for(min(design.fractions), n)
    reason = None
    if n > design.max_tokens:
        reason = f"its first turn alone is {n} tokens > the cut at {design.max_tokens}"
    elif turns < design.min_turns:
        reason = f"{turns} assistant turns < {design.min_turns}"
    elif n < design.min_tokens:
        reason = f"{n} tokens < {design.min_tokens}"
    elif design.max_prompt_share is not None and p > design.max_prompt_share * k:
        reason = f"prompt {p} > {design.max_prompt_share:g} x K ({k})"
    elif n <= k + design.buffer:
        reason = f"{n} tokens never reach K + r = {k + design.buffer}"
    return Eligibility(stream.name, n, p, turns, stream.n_scored, k, reason)


def select(design: Design, streams: Sequence[Stream]) -> tuple[list[Stream], list[Eligibility]]:
    """The design's episodes: the first `n_episodes` eligible ones in the order given (all of them
    when fewer are eligible), and the eligibility of every episode looked at."""
    names = [s.name for s in streams]
    if len(set(names)) != len(names):
        raise ConfigError("episodes: two episodes share a name; the study pairs policies by episode name")
    rows = [eligibility(design, s) for s in streams]
    chosen = [s for s, e in zip(streams, rows, strict=True) if e.reason is None][: design.n_episodes]
    return chosen, rows


# ----------------------------------------------------------------------- the two designs
_RANDOM_PILOT = (
    "the median SD of log(KL random / KL baseline) for TriAttention and SnapKV over the 4 settings of "
    "the previous study (docs/study.md before issue #27: 8 episodes, protect=sink, no recent buffer)"
)
_NEXUS_PILOT = (
    "the median SD of log(KL nexus / KL baseline) for SnapKV, PyramidKV and H2O at K=0.2 in both modes "
    "of the previous study (8 episodes of <= 768 tokens)"
)

RANDOM = Design(
    claim="random",
    title="Random Attention",
    statement="with the prompt protected and the papers' recent buffer, uniform random eviction is about "
    "as good as the paper's named baselines (TriAttention, SnapKV): within a factor 1.25 in KL.",
    subject="random",
    named=("triattention", "snapkv"),
    arms=(
        Arm("random", "random", "prompt", seeded=True),
        Arm("triattention", "triattention", "prompt"),
        Arm("snapkv", "snapkv", "prompt"),
        Arm("rkv", "rkv", "prompt"),
        Arm("h2o", "h2o", "prompt"),
        Arm("tova", "tova", "prompt"),
        Arm("vase", "vase", "prompt", seeded=True),
        Arm("recency+prompt", "streaming", "prompt"),
        Arm("random (sink)", "random", "sink", seeded=True),
        Arm("snapkv (sink)", "snapkv", "sink"),
    ),
    modes=("persistent", "reprefill"),
    primary_modes=("persistent", "reprefill"),
    fractions=(0.25,),
    test="equivalence",
    buffer=64,
    window=16,
    framework=FRAMEWORK,
    seeds=(0, 1),
    clip_chars=2000,
    clip_prompt_chars=400,
    max_tokens=3072,
    min_turns=3,
    min_tokens=2048,
    max_prompt_share=0.5,
    pilot_sd=0.26,
    pilot=_RANDOM_PILOT,
    ablations=(("random (sink)", "random"), ("snapkv (sink)", "snapkv"), ("random (sink)", "snapkv (sink)")),
)

NEXUS = Design(
    claim="nexus",
    title="Nexus Sampling",
    statement="under persistent (irreversible) eviction, reservoir sampling over the walk score (n=5) "
    "gives lower KL than deterministic top-K, on the same weights (n=0) and against SnapKV, PyramidKV, "
    "H2O and MorphKV, by a margin that grows with the context.",
    subject="nexus",
    named=("nexus n=0", "snapkv", "pyramidkv", "h2o", "morphkv"),
    arms=(
        Arm("nexus", "nexus", "sink", {"n": 5}, seeded=True),
        Arm("nexus n=0", "nexus", "sink", {"n": 0}),
        Arm("snapkv", "snapkv", "sink"),
        Arm("pyramidkv", "pyramidkv", "sink"),
        Arm("h2o", "h2o", "sink"),
        Arm("morphkv", "morphkv", "sink"),
        # Non-vacuous protection ablation: nexus forces its sink block whatever `protect` says, so
        # only sink_blocks=0 with protect=none takes the sink away.
        Arm(
            "nexus (no sink)",
            "nexus",
            "none",
            {"n": 5, "sink_blocks": 0},
            modes=("persistent",),
            fractions=(0.1,),
        ),
    ),
    modes=("persistent", "reprefill"),
    primary_modes=("persistent",),
    fractions=(0.1, 0.2),
    test="superiority",
    buffer=32,
    window=16,
    framework=FRAMEWORK,
    seeds=(0, 1),
    clip_chars=None,
    clip_prompt_chars=None,
    max_tokens=8000,
    min_turns=3,
    min_tokens=4096,
    max_prompt_share=None,
    pilot_sd=0.28,
    pilot=_NEXUS_PILOT,
    margin=math.log(1.35),
    ablations=(("nexus (no sink)", "nexus"),),
    trend_against="nexus n=0",
)

DESIGNS = {d.claim: d for d in (RANDOM, NEXUS)}
