"""What one episode records: its turns, its result (with both patches), the live events for
displays, and the interruption that carries a partial result. Data only; the loop fills it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from kvagent.agent.config import AgentConfig

EXIT_STATUSES = ("submitted", "step_limit", "context_limit", "error")
# A reply whose generation the user stopped (chat's Ctrl-C); its tokens stay in the stream.
INTERRUPTED = "interrupted"


@dataclass
class Turn:
    """One model call and what followed it."""

    step: int
    reply: str = ""
    reply_tokens: int = 0
    finish_reason: str = ""
    call: dict[str, Any] | None = None  # {"name", "params"} of a valid call
    call_error: str | None = None  # why the reply's call was rejected
    observation: str | None = None
    observation_tokens: int = 0
    thinking_forgotten: int = 0  # history=drop-thinking: this reply's tokens forgotten from the cache
    # history=...+mask-observations: tokens of older observations forgotten (persistent) or cut by
    # their placeholder (reprefill) before this turn's observation was fed
    observations_masked: int = 0
    rewound: int = 0  # history=r2egym: stream tokens taken back to put R2E-Gym's rendering of the reply
    fed: bool = False  # observation appended to the session (not after the episode's last step)
    logical_length: int = 0  # after this turn's tokens were fed
    cache_entries: int | None = None  # max entries held by a layer after this turn
    cache: dict[str, Any] | None = None  # the session's full CacheStats
    generate_s: float = 0.0
    tool_s: float = 0.0
    append_s: float = 0.0


@dataclass
class EpisodeResult:
    exit_status: str  # one of EXIT_STATUSES
    patch: str  # the graded one: patches[graded_patch]
    messages: list[dict[str, str]]  # exactly the rendered token stream, in order
    turns: list[Turn]
    config: AgentConfig
    error: str | None = None
    prompt_tokens: int = 0
    logical_length: int = 0
    elapsed_s: float = 0.0
    patches: dict[str, str] = field(default_factory=dict)  # "full" (the whole diff), "r2egym" (its rule)
    graded_patch: str = "full"  # which of them `patch` is (config.patch_rule)
    renderer: str = "chatml"  # how the stream was rendered: the model's chat_template, or chatml

    @property
    def steps(self) -> int:
        return len(self.turns)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["config"] = self.config.to_dict()
        d["steps"] = self.steps
        return d


class EpisodeInterrupted(KeyboardInterrupt):
    """Ctrl-C during `Agent.run`: still a KeyboardInterrupt (a batch stops), carrying the partial
    result (exit status `interrupted`) so the caller can keep its trajectory."""

    def __init__(self, result: EpisodeResult) -> None:
        super().__init__("episode interrupted")
        self.result = result


@dataclass
class AgentEvent:
    """Live progress for displays: `kind` is start | reply | observation | end."""

    kind: str
    step: int
    max_steps: int
    logical_length: int
    cache_entries: int | None
    stats: Any
    turn: Turn | None = None
    exit_status: str | None = None


def cache_summary(stats: Any) -> tuple[int | None, dict[str, Any] | None]:
    """(largest per-layer entry count, full stats dict) from a CacheStats-like object."""
    if stats is None:
        return None, None
    entries = getattr(stats, "entries", None)
    fill = max(entries) if entries else None
    full = stats.to_dict() if hasattr(stats, "to_dict") else None
    return fill, full
