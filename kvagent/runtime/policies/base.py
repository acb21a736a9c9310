"""The policy contract: a policy turns a read-only view of one layer into keep priorities.

The runtime does everything else (protection = +inf, top-K per head or per block, gather,
compaction, bookkeeping), so a policy is a few lines of scoring math.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from kvagent.runtime.policies._args import reject_unknown, validate


@dataclass
class LayerView:
    """Read-only view of one layer's cache at an eviction round.

    Shapes: B batch, H_kv key/value heads, H_q query heads, N cached entries, D head dim,
    W window queries (W <= config window; fewer early in an episode).
    """

    keys: torch.Tensor  # (B, H_kv, N, D), post-RoPE
    values: torch.Tensor  # (B, H_kv, N, D)
    positions: torch.Tensor  # (B, H_kv, N) logical positions, ascending along N; -1 = PAD (no entry)
    queries: torch.Tensor  # (B, H_q, W, D) last W post-RoPE queries of this layer
    query_positions: torch.Tensor  # (W,) logical positions of those queries
    layer_idx: int
    n_layers: int
    group_size: int  # H_q // H_kv (GQA); query head h reads kv head h // group_size
    scaling: float  # softmax scale the model uses (usually D ** -0.5)
    generator: torch.Generator  # seeded per (session seed, layer, round); the only randomness allowed
    budget: int  # K for this layer: entries per head kept after the round (adaptive: on average)
    protected: torch.Tensor  # (B, H_kv, N) bool, kept whatever the score
    # The recent buffer (framework recent-buffer): the newest `recent_buffer` entries of every head
    # are kept outside K whatever the score, so they are no candidates. 0 under topk-all, where a
    # policy's own recency keep (SnapKV's window, H2O's recent share) is on by default instead.
    recent_buffer: int = 0
    # Block partition for block policies (block > 1): (N,) block id per entry, -1 for protected
    # entries. Ids ascend with recency (0 = oldest block; the newest block is always whole, the
    # oldest may be short). None for token policies.
    block_ids: torch.Tensor | None = None
    # (S,) ascending logical positions where the session marked a segment (Session.mark_segment: a
    # tool output, a reply); None when none is marked. Segment-aware policies (segments.py) read it.
    segment_starts: torch.Tensor | None = None
    # Queries since the previous round (B, H_q, M, D) and their positions (M,), only for policies
    # that set `needs_pending_queries` (H2O); otherwise None.
    pending_queries: torch.Tensor | None = None
    pending_positions: torch.Tensor | None = None
    # Per-policy, per-layer state that survives rounds. Tensors under state["per_entry"] whose
    # last dim is N are kept aligned with the cache by the runtime: gathered at compaction and
    # zero-padded for entries appended since.
    state: dict[str, Any] = field(default_factory=dict)

    @property
    def n_entries(self) -> int:
        return self.keys.shape[-2]

    @property
    def recent_buffer_mask(self) -> torch.Tensor:
        """(B, H_kv, N) bool: each head's `recent_buffer` newest real entries (positions ascend along
        N and a ragged head's PAD entries come first, so they are its last `recent_buffer`)."""
        pos = self.positions
        mask = torch.zeros(pos.shape, dtype=torch.bool, device=pos.device)
        if self.recent_buffer > 0:
            mask[..., max(0, pos.shape[-1] - self.recent_buffer) :].fill_(True)
        return mask & (pos >= 0)

    @property
    def candidates(self) -> torch.Tensor:
        """(B, H_kv, N) bool: the entries a round chooses among (real, not protected, not in the
        recent buffer)."""
        return (self.positions >= 0) & ~self.protected & ~self.recent_buffer_mask


@dataclass
class BasePolicy:
    """The one policy contract: `scores(view)` gives (B, H_kv, N) or (B, 1, N) keep priorities (higher
    = keep; +inf forces a keep) and the runtime keeps the top `budget` per head. Subclasses override
    `scores` and the class attributes; the rest are defaults.

    Knobs are dataclass fields of the subclass (`@dataclass`, defaults from `_args.knob` and its
    typed variants, which name the field's check). `make_policy` refuses unknown knobs and
    `__post_init__` runs each field's check, so a subclass writes neither `__init__` nor `__repr__`
    (the dataclass generates it). The class attributes below are not fields: a subclass may
    derive one from a knob (a property, or a field of the same name, as nexus's `block`)."""

    name = "base"
    shared_across_heads = False  # one keep-set for all heads of a layer (nexus) or one per head
    block = 1  # 1 = token granularity
    needs_pending_queries = False  # H2O: the runtime keeps all queries since the last round
    adaptive_heads = False  # scores comparable across heads: head_budget=adaptive may use them
    schedule = "uniform"  # how layer_budgets splits K over depth; bench fidelity records it
    # Constructor arguments the session fills from the model (Engine.model_facts) or the cache
    # config (its `window`) when policy_args leaves them out, e.g. TriAttention's RoPE base and
    # PyramidKV's window: a user should not have to copy them by hand.
    model_args: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        validate(self)

    def layer_budgets(self, budget: int, n_layers: int) -> list[int]:
        """Per-layer K. Uniform by default; PyramidKV overrides (same total)."""
        return [budget] * n_layers

    def absorb(self, view: LayerView) -> None:  # noqa: B027 - optional hook
        """Fold pending queries into state without evicting (bounds H2O's query buffer)."""

    def scores(self, view: LayerView) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError


def own_recency(value: Any, legacy: Any, off: Any, view: LayerView) -> Any:
    """A policy's recency knob whose None means "the framework decides": `value` when given, else
    `off` where the runtime keeps a recent buffer (view.recent_buffer > 0, recent-buffer), else
    `legacy` (the policy's own default, under topk-all)."""
    if value is not None:
        return value
    return off if view.recent_buffer > 0 else legacy


_REGISTRY: dict[str, type[BasePolicy]] = {}


def register(cls: type[BasePolicy]) -> type[BasePolicy]:
    """Class decorator: make a policy available by its `name` in CacheConfig.policy."""
    if "__init__" in vars(cls) and "__dataclass_fields__" not in vars(cls):
        raise TypeError(f"policy {cls.name!r}: declare its knobs as dataclass fields, not in __init__")
    _REGISTRY[cls.name] = cls
    return cls


def available() -> list[str]:
    """The registered policies' names (built-in ones and any registered since)."""
    _load_builtin()
    return sorted(_REGISTRY)


def check_policy(name: str, what: str = "policy") -> None:
    """The one check of a policy name: a one-line ConfigError naming `what` and the choices."""
    if name not in available():
        from kvagent.errors import ConfigError

        raise ConfigError(f"{what}: unknown policy {name!r}; choose one of {', '.join(available())}")


def model_defaults(name: str, facts: dict[str, Any], policy_args: dict[str, Any]) -> dict[str, Any]:
    """The policy's `model_args` that `facts` knows and `policy_args` does not set."""
    check_policy(name)
    wanted = _REGISTRY[name].model_args
    return {k: facts[k] for k in wanted if k not in policy_args and facts.get(k) is not None}


def make_policy(name: str, **policy_args: Any) -> BasePolicy:
    """The one way a policy is made from user options: unknown knobs are refused naming the valid
    ones, and every knob's check runs (a one-line ConfigError either way)."""
    check_policy(name)
    cls = _REGISTRY[name]
    reject_unknown(name, policy_args, cls)
    try:
        return cls(**policy_args)
    except TypeError as e:
        from kvagent.errors import ConfigError

        raise ConfigError(
            f"policy_args: {name} rejects {sorted(policy_args)} ({e}); remove or rename them"
        ) from None


def _load_builtin() -> None:
    # Importing the package registers the built-in policies.
    import kvagent.runtime.policies  # noqa: F401
