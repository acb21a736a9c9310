"""Configuration of one evictable-cache session, and of sampling."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from kvagent.errors import ConfigError

PROTECT = ("prompt", "sink", "none")
SCOPES = ("prefill", "prefill+decode")
MODES = ("persistent", "reprefill")
HEAD_BUDGETS = ("uniform", "adaptive")
# How a round picks what stays (docs/architecture.md, "Eviction framework"): "recent-buffer" (both
# papers': the newest r entries are never scored) or "topk-all" (kvagent before issue #26).
FRAMEWORKS = ("recent-buffer", "topk-all")
# When a round runs on each layer, where layers hold different counts (PyramidKV's per-layer K, a
# block policy's cuts): "layer", at its own trigger; "shared", every layer over what a round leaves,
# whenever any layer is due.
CADENCES = ("layer", "shared")
SINK_TOKENS = 4


@dataclass(frozen=True)
class CacheConfig:
    """How a session's cache is bounded and evicted (docs/architecture.md, runtime)."""

    policy: str = "full"
    budget: int | float | None = None  # K; float in (0,1) = fraction of the logical length at the round
    buffer: int = 128  # r: rounds fire every r tokens (at K + 2r under recent-buffer, K + r under topk-all)
    protect: str = "prompt"
    scope: str = "prefill+decode"
    mode: str = "persistent"
    window: int = 16  # W
    seed: int = 0
    policy_args: dict[str, Any] = field(default_factory=dict)
    audit: bool = False  # record kept positions per (layer, head) at every round
    prefill_chunk: int = 512  # tokens per forward while prefilling (bounds activation memory)
    head_budget: str = "uniform"  # "adaptive": Ada-KV, heads of a layer share K x H_kv (heads.py)
    # "recent-buffer": the newest r entries are kept unscored, a round keeps the top K of the rest
    # (K + r held after it, K + 2r at most); "topk-all": the top K of all entries (K + r at most).
    framework: str = "recent-buffer"
    # "layer": each layer's round runs when it reaches its own trigger (K_l + 2r), so layers with
    # different K step the stream a few tokens at a time; "shared": when any layer is due, every
    # layer holding more than a round leaves gets its round too, so they stay in phase (one round
    # per r tokens) with the same K_l + 2r bound. Identical where every layer holds the same count.
    cadence: str = "layer"

    def __post_init__(self) -> None:
        from kvagent.runtime.policies import check_policy

        check_policy(self.policy)
        object.__setattr__(self, "budget", checked_budget(self.budget))
        if self.buffer < 1:
            raise ConfigError(f"buffer: must be >= 1, got {self.buffer}")
        if self.protect not in PROTECT:
            raise ConfigError(f"protect: got {self.protect!r}; choose one of {', '.join(PROTECT)}")
        if self.scope not in SCOPES:
            raise ConfigError(f"scope: got {self.scope!r}; choose one of {', '.join(SCOPES)}")
        if self.mode not in MODES:
            raise ConfigError(f"mode: got {self.mode!r}; choose one of {', '.join(MODES)}")
        if self.window < 1:
            raise ConfigError(f"window: must be >= 1, got {self.window}")
        if self.prefill_chunk < 1:
            raise ConfigError(f"prefill_chunk: must be >= 1, got {self.prefill_chunk}")
        if self.head_budget not in HEAD_BUDGETS:
            raise ConfigError(
                f"head_budget: got {self.head_budget!r}; choose one of {', '.join(HEAD_BUDGETS)}"
            )
        if self.framework not in FRAMEWORKS:
            raise ConfigError(f"framework: got {self.framework!r}; choose one of {', '.join(FRAMEWORKS)}")
        if self.cadence not in CADENCES:
            raise ConfigError(f"cadence: got {self.cadence!r}; choose one of {', '.join(CADENCES)}")
        if self.recent_buffer and self.evicts:
            problem = buffer_fit_problem(self)
            if problem:
                raise ConfigError(problem)
        if self.adaptive_heads:
            from kvagent.runtime.heads import check_adaptive

            problem = check_adaptive(build_policy(self), self.policy)
            if problem:
                raise ConfigError(problem)

    @property
    def evicts(self) -> bool:
        return self.budget is not None and self.policy != "full"

    @property
    def adaptive_heads(self) -> bool:
        """Ada-KV: an evicting cache whose heads of a layer share K x H_kv (heads.py)."""
        return self.evicts and self.head_budget == "adaptive"

    @property
    def recent_buffer(self) -> int:
        """The recent buffer's size: a layer's newest entries, which a round keeps unscored (r under
        recent-buffer, else 0). Not the policies' own recency knobs (h2o's `recent`, ...)."""
        return self.buffer if self.framework == "recent-buffer" else 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __getstate__(self) -> dict[str, Any]:
        """A copy (pickle, deepcopy) carries the fields, not the policies `build_policy` kept."""
        return {k: v for k, v in self.__dict__.items() if k != "_policies"}


def budget_value(value: Any, what: str = "budget") -> int | float | None:
    """The one parse and range check of a budget (K), for CacheConfig, every command's option (`1024`,
    `0.2`, a sweep's items) and serve's kv_budget: tokens (an int >= 1; a whole float is tokens), a
    fraction of the logical length (a float in (0,1)), or none (None, or the text none/dense/empty)
    for the full cache. `what`: the option the errors name."""
    if not isinstance(value, str):
        return checked_budget(value, what)
    item = value.strip()
    if item.lower() in ("none", "dense", ""):
        return None
    try:
        b = float(item) if any(c in item for c in ".eE") else int(item)
    except ValueError:
        raise ConfigError(
            f"{what}: {item!r} is not a number; pass tokens (1024) or a fraction (0.2)"
        ) from None
    return checked_budget(b, what)


def checked_budget(b: Any, what: str = "budget") -> int | float | None:
    """The range check of a budget given as a value (`budget_value`'s, CacheConfig's)."""
    if b is None:
        return None
    if isinstance(b, bool) or not isinstance(b, int | float):
        raise ConfigError(f"{what}: expected an int (tokens) or a float in (0,1), got {b!r}")
    if isinstance(b, float) and not 0.0 < b < 1.0:
        if not (b.is_integer() and b >= 1):
            raise ConfigError(
                f"{what}: a float budget is a fraction in (0,1), got {b}; pass tokens as an int"
            )
        b = int(b)
    if isinstance(b, int) and b < 1:
        raise ConfigError(
            f"{what}: must be >= 1 token, got {b}; pass tokens (1024), a fraction (0.2), or no budget for "
            "the full cache"
        )
    return b


def budget_problem(policy: str, budget: int | float | None, say: Callable[..., str]) -> str | None:
    """The rule of a run's cache settings that spans two fields, which CacheConfig leaves to the
    commands (it takes a policy without a budget as the full cache): a policy evicts only under a
    budget, and `full` takes none. `say(field, value=None)` spells a setting as the caller takes it
    (`--budget 1024`, `kv_budget 1024`); None when the settings are fine."""
    if policy != "full" and budget is None:
        return (
            f"budget: {say('policy', policy)} evicts only under a budget; add {say('budget', 'K')} (e.g. "
            f"{say('budget', 1024)}) or a fraction ({say('budget', 0.2)}), or use {say('policy', 'full')}"
        )
    if policy == "full" and budget is not None:
        return (
            f"budget: {say('policy', 'full')} never evicts, so {say('budget', budget)} would do nothing; pick "
            f"an evicting policy (e.g. {say('policy', 'snapkv')}) or drop {say('budget')}"
        )
    return None


def build_policy(config: CacheConfig, model_facts: Mapping[str, Any] | None = None) -> Any:
    """The policy object of `config`, built in this one place: its policy_args, and what it takes
    from the run (`model_args`: the config's window, the engine's `model_facts`) where policy_args
    leaves it out. The session's plan passes its engine's facts; a check before the engine loads
    passes none (what it asks, K's split and the block, needs no model fact). Built once per config
    and filled-in facts: the config keeps it (policies hold knobs, no state; a session's policy
    state is its evictor's), so the config's own checks, `check_run` and the session share one."""
    from kvagent.runtime.policies import make_policy
    from kvagent.runtime.policies.base import model_defaults

    known = {**(model_facts or {}), "window": config.window}
    filled = model_defaults(config.policy, known, config.policy_args)
    # A model fact (TriAttention's RoPE frequencies, a tensor) by identity; the policy keeps it alive.
    key = repr(sorted((k, v if isinstance(v, int | float | str) else id(v)) for k, v in filled.items()))
    built: dict[str, Any] = config.__dict__.setdefault("_policies", {})
    if key not in built:
        built[key] = make_policy(config.policy, **filled, **config.policy_args)
    return built[key]


def buffer_fit_problem(config: CacheConfig) -> str | None:
    """Why the recent buffer cannot be kept outside a block policy's blocks (None if it can): under
    recent-buffer, r must be whole blocks, so the entries that leave the buffer at each round are
    whole blocks of consecutive positions, never half a block joined to older entries."""
    block = build_policy(config).block
    r = config.buffer
    if block <= 1 or r % block == 0:
        return None
    lo = r // block * block
    fits = f"{lo} or {lo + block}" if lo else f"{block}"
    return (
        f"buffer: {r} is not a multiple of {config.policy}'s block {block} (framework recent-buffer keeps "
        f"the newest r entries outside the blocks); use --buffer {fits}, or --framework topk-all"
    )


@dataclass(frozen=True)
class Sampling:
    """Decoding settings. temperature 0 = greedy."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ConfigError(f"temperature: must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p: must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ConfigError(f"top_k: must be >= 0 (0 = off), got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
