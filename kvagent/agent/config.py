"""Settings of one agent episode (DeepSWE defaults)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from kvagent.agent.prompts import DEFAULT_STYLE, INSTANCE_STYLES
from kvagent.errors import ConfigError

SCAFFOLDS = ("kvagent", "r2egym")
HISTORIES = ("keep-thinking", "drop-thinking")


@dataclass(frozen=True)
class AgentConfig:
    max_steps: int = 100  # hard limit on model calls
    soft_step_limit: int | None = 40  # past this many steps every observation says "submit now"
    urge_remaining: int = 3  # ... and also once this few steps remain
    context_limit: int = 65_536  # logical tokens; reaching it ends the episode with `context_limit`
    max_new_tokens: int | None = 8192  # per reply; None = no cap (the reply may fill the context)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = 0
    command_timeout: float = 90.0  # seconds per tool call
    prompt_style: str = DEFAULT_STYLE
    repo_dir: str | None = None  # path the prompts name; None = the environment's `workdir`, else /testbed
    stop: tuple[str, ...] = ("</function>",)
    scaffold: str = "kvagent"  # protocol profile: kvagent | r2egym (R2E-Gym's evaluation, docs/deepswe.md)
    history: str = "keep-thinking"  # keep-thinking | drop-thinking (past replies' <think> leave the cache)
    prompts: str | None = None  # YAML prompt file (system_prompt, instance_prompt, ...); None = kvagent's
    # The file's texts, read once: the config travels (Ray workers) without the file.
    prompt_texts: tuple[tuple[str, str], ...] | None = None

    def __post_init__(self) -> None:
        for name in ("max_steps", "context_limit", "max_new_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name}: must be >= 1, got {value}")
        if self.scaffold not in SCAFFOLDS:
            raise ConfigError(f"scaffold: got {self.scaffold!r}; choose one of {', '.join(SCAFFOLDS)}")
        if self.history not in HISTORIES:
            raise ConfigError(f"history: got {self.history!r}; choose one of {', '.join(HISTORIES)}")
        if self.prompts is not None and self.prompt_texts is None:
            from kvagent.agent.prompt_file import load_prompt_file

            texts = load_prompt_file(self.prompts).texts()  # a bad file fails here, before any model
            object.__setattr__(self, "prompt_texts", texts)
        if self.soft_step_limit is not None and self.soft_step_limit < 0:
            raise ConfigError(f"soft_step_limit: must be >= 0 or None (off), got {self.soft_step_limit}")
        if self.command_timeout <= 0:
            raise ConfigError(f"command_timeout: must be > 0 seconds, got {self.command_timeout}")
        if self.prompt_style not in INSTANCE_STYLES:
            raise ConfigError(
                f"prompt_style: got {self.prompt_style!r}; choose one of {', '.join(INSTANCE_STYLES)}"
            )
        object.__setattr__(self, "stop", tuple(self.stop))
        self.sampling()  # temperature, top_p, top_k: a bad one fails here, not at the first reply

    @classmethod
    def r2egym(cls, **overrides: Any) -> AgentConfig:
        """R2E-Gym's evaluation setting for DeepSWE: countdown from 40, hard limit 100, no per-reply cap,
        65,536 tokens in all, temperature 1 (docs/deepswe.md)."""
        base: dict[str, Any] = dict(
            scaffold="r2egym", max_steps=100, soft_step_limit=40, max_new_tokens=None,
            context_limit=65_536, temperature=1.0, history="drop-thinking",
        )  # fmt: skip
        return cls(**{**base, **overrides})

    def prompt_file(self) -> Any:
        """The `PromptFile` of `prompts` (as read when the config was made), or None."""
        if self.prompt_texts is None:
            return None
        from kvagent.agent.prompt_file import PromptFile

        return PromptFile(path=str(self.prompts), **dict(self.prompt_texts))

    def sampling(self) -> Any:
        from kvagent.runtime.config import Sampling

        return Sampling(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, seed=self.seed)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["stop"] = list(self.stop)
        texts = d.pop("prompt_texts")  # the messages hold the texts; the record keeps their digest
        if texts is not None:
            import hashlib

            d["prompts_sha256"] = hashlib.sha256(repr(texts).encode()).hexdigest()
        return d
