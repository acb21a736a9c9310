"""Settings of one agent episode (DeepSWE defaults)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from kvagent.agent.prompts import DEFAULT_STYLE, INSTANCE_STYLES
from kvagent.errors import ConfigError


@dataclass(frozen=True)
class AgentConfig:
    max_steps: int = 100  # hard limit on model calls
    soft_step_limit: int | None = 40  # past this many steps every observation says "submit now"
    urge_remaining: int = 3  # ... and also once this few steps remain
    context_limit: int = 65_536  # logical tokens; reaching it ends the episode with `context_limit`
    max_new_tokens: int = 8192  # per reply
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = 0
    command_timeout: float = 90.0  # seconds per tool call
    prompt_style: str = DEFAULT_STYLE
    repo_dir: str | None = None  # path the prompts name; None = the environment's `workdir`, else /testbed
    stop: tuple[str, ...] = ("</function>",)

    def __post_init__(self) -> None:
        for name in ("max_steps", "context_limit", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.soft_step_limit is not None and self.soft_step_limit < 0:
            raise ConfigError(f"soft_step_limit: must be >= 0 or None (off), got {self.soft_step_limit}")
        if self.command_timeout <= 0:
            raise ConfigError(f"command_timeout: must be > 0 seconds, got {self.command_timeout}")
        if self.prompt_style not in INSTANCE_STYLES:
            raise ConfigError(
                f"prompt_style: got {self.prompt_style!r}; choose one of {', '.join(INSTANCE_STYLES)}"
            )
        object.__setattr__(self, "stop", tuple(self.stop))

    def sampling(self) -> Any:
        from kvagent.runtime.config import Sampling

        return Sampling(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, seed=self.seed)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["stop"] = list(self.stop)
        return d
