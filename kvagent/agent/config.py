"""Settings of one agent episode (DeepSWE defaults)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from kvagent.agent.history import REPLY_RULES, History, parse_history
from kvagent.agent.prompts import DEFAULT_STYLE, INSTANCE_STYLES
from kvagent.errors import ConfigError

SCAFFOLDS = ("kvagent", "r2egym")
# keep-thinking: every reply stays verbatim; drop-thinking: past replies' reasoning is forgotten;
# r2egym: each reply is replaced by R2E-Gym's re-rendering of it (its call only) once answered.
# Any of them `+mask-observations[=M]` (or that alone): observation masking (history.py).
HISTORIES = REPLY_RULES
PATCH_RULES = ("full", "r2egym")  # the graded patch: the whole diff, or R2E-Gym's .py / str_replace rule
BY_SCAFFOLD = "scaffold"  # a field left to the scaffold: what the protocol itself does
# What each protocol does where a field is left to it. R2E-Gym's (docs/deepswe.md): no per-reply cap
# and no stop strings (a reply runs to end of turn), its history rendering, its patch rule.
SCAFFOLD_DEFAULTS: dict[str, dict[str, Any]] = {
    "kvagent": {
        "max_new_tokens": 8192,
        "stop": ("</function>",),
        "history": "keep-thinking",
        "patch_rule": "full",
    },
    "r2egym": {"max_new_tokens": None, "stop": (), "history": "r2egym", "patch_rule": "r2egym"},
}
# Sampling fields a model's generation_config.json may set (as vLLM reads it); None = not set there.
MODEL_SAMPLING = ("top_p", "top_k")
NEUTRAL_SAMPLING = {"top_p": 1.0, "top_k": 0}


@dataclass(frozen=True)
class AgentConfig:
    """One episode's settings. Fields left at BY_SCAFFOLD take the scaffold's value (so
    `AgentConfig(scaffold="r2egym")` is R2E-Gym's whole protocol and any field given overrides it);
    top_p / top_k left None take the model's generation_config.json, as vLLM does, else neutral."""

    max_steps: int = 100  # hard limit on model calls
    soft_step_limit: int | None = 40  # past this many steps every observation says "submit now"
    urge_remaining: int = 3  # ... and also once this few steps remain
    context_limit: int = 65_536  # logical tokens; reaching it ends the episode with `context_limit`
    max_new_tokens: int | None | str = (
        BY_SCAFFOLD  # per reply; None = no cap (the reply may fill the context)
    )
    temperature: float = 1.0  # always sent, as R2E-Gym sends it
    top_p: float | None = None  # None: the model's generation_config.json, else 1.0
    top_k: int | None = None  # None: the model's generation_config.json, else 0 (off)
    seed: int | None = 0
    command_timeout: float = 90.0  # seconds per tool call
    prompt_style: str = DEFAULT_STYLE
    repo_dir: str | None = None  # path the prompts name; None = the environment's `workdir`, else /testbed
    stop: tuple[str, ...] | str = BY_SCAFFOLD  # stop strings of every reply (the scaffold's one rule)
    scaffold: str = "kvagent"  # protocol profile: kvagent | r2egym (R2E-Gym's evaluation, docs/deepswe.md)
    # keep-thinking | drop-thinking | r2egym (how past replies stay in the cache), each optionally
    # `+mask-observations[=M]` (only the newest M observations stay whole; history.py)
    history: str = BY_SCAFFOLD
    patch_rule: str = BY_SCAFFOLD  # full | r2egym: which patch is graded (both are recorded)
    prompts: str | None = None  # YAML prompt file (system_prompt, instance_prompt, ...); None = kvagent's
    r2egym_path: str | None = None  # a checkout of R2E-Gym: its prompt file and hard-coded strings
    # The texts of `r2egym_path` then `prompts`, read once: the config travels (Ray workers) without them.
    prompt_texts: tuple[tuple[str, str], ...] | None = None
    # R2E-Gym's tool scripts of `r2egym_path` (name, bytes), read once: the sandbox installs these.
    tool_scripts: tuple[tuple[str, bytes], ...] | None = None
    # chardet for them where the image has none, as R2E-Gym installs it: (lowest Python, wheel bytes)
    tool_wheels: tuple[tuple[str, bytes], ...] | None = None
    # What the model's generation_config.json said (set by `with_model_defaults`), for the record.
    model_sampling: tuple[tuple[str, Any], ...] = ()
    sampling_from_model: tuple[str, ...] = ()  # the fields taken from it

    def __post_init__(self) -> None:
        if self.scaffold not in SCAFFOLDS:
            raise ConfigError(f"scaffold: got {self.scaffold!r}; choose one of {', '.join(SCAFFOLDS)}")
        for name, value in SCAFFOLD_DEFAULTS[self.scaffold].items():
            if getattr(self, name) == BY_SCAFFOLD:
                object.__setattr__(self, name, value)
        for name in ("max_steps", "context_limit", "max_new_tokens"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ConfigError(f"{name}: must be >= 1, got {value}")
        if self.rules.reply == "r2egym" and self.scaffold != "r2egym":
            raise ConfigError(
                "history: r2egym re-renders replies as R2E-Gym reads them; use it with --scaffold r2egym"
            )
        if self.patch_rule not in PATCH_RULES:
            raise ConfigError(f"patch_rule: got {self.patch_rule!r}; choose one of {', '.join(PATCH_RULES)}")
        if self.r2egym_path is not None and self.scaffold != "r2egym":
            raise ConfigError(
                "r2egym: a checkout's strings are R2E-Gym's protocol; add --scaffold r2egym "
                "(or pass only --prompts FILE)"
            )
        if self.prompt_texts is None and (self.prompts is not None or self.r2egym_path is not None):
            object.__setattr__(self, "prompt_texts", self._read_texts())  # bad files fail here
        if self.tool_scripts is None and self.r2egym_path is not None:
            from kvagent.agent.r2egym_source import prompt_file_path
            from kvagent.agent.r2egym_tools import load_tools

            scripts = load_tools(self.r2egym_path, prompt_file_path(Path(self.r2egym_path).expanduser()))
            object.__setattr__(self, "tool_scripts", scripts)
        if self.tool_wheels is None and self.r2egym_path is not None:
            from kvagent.agent.r2egym_tools import chardet_cap, chardet_wheels

            cap = chardet_cap(self.r2egym_path)  # none in a checkout without uv.lock: nothing added
            object.__setattr__(self, "tool_wheels", chardet_wheels(cap) if cap else ())
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

    @property
    def rules(self) -> History:
        """The history setting parsed: the reply rule and observation masking's M (checked once)."""
        return parse_history(self.history)

    def _read_texts(self) -> tuple[tuple[str, str], ...]:
        """The checkout's texts (--r2egym), overridden key by key by the prompt file's (--prompts)."""
        texts: dict[str, str] = {}
        if self.r2egym_path is not None:
            from kvagent.agent.r2egym_source import load_checkout

            texts.update(load_checkout(self.r2egym_path).texts())
        if self.prompts is not None:
            from kvagent.agent.prompt_file import load_prompt_file

            texts.update(load_prompt_file(self.prompts).texts())
        return tuple(texts.items())

    def with_model_defaults(self, generation: Mapping[str, Any]) -> AgentConfig:
        """This config with top_p / top_k left unset taken from `generation` (a model's
        generation_config.json, as `generation_defaults` reads it), which is also recorded."""
        chosen = {k: generation[k] for k in MODEL_SAMPLING if getattr(self, k) is None and k in generation}
        return replace(
            self,
            **chosen,
            model_sampling=tuple(sorted(generation.items())),
            sampling_from_model=tuple(chosen),
        )

    def prompt_file(self) -> Any:
        """The `PromptFile` of `prompts` (as read when the config was made), or None."""
        if self.prompt_texts is None:
            return None
        from kvagent.agent.prompt_file import PromptFile

        return PromptFile(path=str(self.prompts), **dict(self.prompt_texts))

    def sampling(self) -> Any:
        from kvagent.runtime.config import Sampling

        top = {
            k: NEUTRAL_SAMPLING[k] if getattr(self, k) is None else getattr(self, k) for k in MODEL_SAMPLING
        }
        return Sampling(temperature=self.temperature, seed=self.seed, **top)

    def sampling_record(self) -> dict[str, Any]:
        """The sampling an episode used and where each value came from (for the run record)."""
        s = self.sampling()
        source = {"temperature": "flag"}
        for k in MODEL_SAMPLING:
            given = getattr(self, k) is not None and k not in self.sampling_from_model
            source[k] = (
                "generation_config.json" if k in self.sampling_from_model else "flag" if given else "neutral"
            )
        return {
            "temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k, "seed": self.seed,
            "source": source, "generation_config": dict(self.model_sampling),
        }  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["stop"] = list(self.stop)
        d["model_sampling"] = dict(self.model_sampling)
        d["sampling_from_model"] = list(self.sampling_from_model)
        import hashlib

        texts = d.pop("prompt_texts")  # the messages hold the texts; the record keeps their digest
        if texts is not None:
            d["prompts_sha256"] = hashlib.sha256(repr(texts).encode()).hexdigest()
        scripts = d.pop("tool_scripts")  # which tool scripts ran: R2E-Gym's (digests) or kvagent's
        d["tools"] = {n: hashlib.sha256(b).hexdigest()[:16] for n, b in scripts} if scripts else "kvagent"
        wheels = d.pop("tool_wheels") or ()
        d["tool_wheels"] = {py: hashlib.sha256(b).hexdigest()[:16] for py, b in wheels}
        return d


def generation_defaults(session: Any) -> dict[str, Any]:
    """The sampling settings of the model's generation_config.json, as vLLM reads them (through
    `to_diff_dict`: the values the file sets), and nothing when the model has no such file
    (transformers then derives one from the model's config: `_from_model_config`)."""
    model = getattr(getattr(session, "engine", None), "model", None)
    generation = getattr(model, "generation_config", None)
    if generation is None or getattr(generation, "_from_model_config", False):
        return {}
    try:
        diff = generation.to_diff_dict()
    except Exception:  # an odd config object: treat as absent
        return {}
    keys = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
    return {k: diff[k] for k in keys if diff.get(k) is not None}
