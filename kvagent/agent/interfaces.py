"""What the agent needs from a model session and from a sandbox, as structural types.

`kvagent.runtime.Session` and `kvagent.sandbox.Sandbox` satisfy these; tests use the doubles of
`kvagent.testing`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol


class Generated(Protocol):
    ids: Sequence[int]  # every sampled id, the last one included; all were fed into the cache
    text: str
    finish_reason: str  # "eos" | "stop" | "length" | "interrupted"


class ModelSession(Protocol):
    """One episode's live cache: the token stream only grows."""

    @property
    def logical_length(self) -> int: ...

    @property
    def stats(self) -> Any: ...  # CacheStats-like: to_dict(), entries (per layer), total_kv_bytes, ...

    def append(self, ids: Sequence[int]) -> Any: ...

    def generate(
        self, max_new_tokens: int, sampling: Any = ..., stop: Sequence[str] = ..., on_token: Any = ...
    ) -> Generated: ...  # on_token(id) -> bool: sees each id; true ends the reply ("interrupted")

    # Optional: only history=drop-thinking calls it. Drops these stream positions (persistent mode:
    # from the live cache, the rest keep their positions; reprefill mode: from the history).
    def forget(self, positions: Sequence[int]) -> int: ...


class ToolResult(Protocol):
    exit_code: int
    output: str  # the tool's observation text
    timed_out: bool


class Environment(Protocol):
    """A sandboxed checkout of the repository with the agent's tools installed."""

    def run_tool(self, name: str, params: Mapping[str, str], timeout: float = 90) -> ToolResult: ...

    def diff(self) -> str: ...


class Engine(Protocol):
    """What `solve_episode` needs from `kvagent.runtime.Engine`."""

    tokenizer: Any

    def session(self, config: Any) -> ModelSession: ...
