"""`--prompts FILE`: the system and instance prompts from a YAML file shaped like R2E-Gym's agent
configs (`system_prompt`, `instance_prompt` with a `{problem_statement}` placeholder), so a user who
holds such a config gets its text verbatim. The file may also carry kvagent's own keys for the other
strings the model reads (see `PromptFile`); what it leaves out keeps kvagent's wording."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvagent.errors import ConfigError

# Keys of R2E-Gym's agent config that are not prompt text: accepted and ignored, so its own file loads.
R2EGYM_OTHER_KEYS = frozenset(
    {"command_files", "llm_name", "llm_base_url", "demo_file", "use_demo", "other_args"}
)
STEPS_REMAINING = "Steps Remaining: {remaining}"
FINAL_STEPS_NOTICE = "You are close to the step limit. Submit your answer now by calling `finish`."


@dataclass(frozen=True)
class PromptFile:
    path: str
    system_prompt: str | None = None  # used verbatim (R2E-Gym does not format it)
    instance_prompt: str | None = None  # str.format(problem_statement=..., working_dir=...)
    # None: kvagent's wording (the profile's).
    steps_remaining: str | None = None  # the countdown line; {remaining} is the count
    final_steps_notice: str | None = None  # shown when the step count is used up
    no_call_message: str | None = None  # observation for a reply without a call

    def texts(self) -> tuple[tuple[str, str], ...]:
        """Every text the file sets, as (key, value) pairs (`PromptFile(path=..., **dict(texts))`)."""
        return tuple((k, getattr(self, k)) for k in PROMPT_KEYS if getattr(self, k) is not None)

    def instance(self, problem_statement: str, working_dir: str) -> str:
        """The instance prompt filled in as R2E-Gym fills it (`str.format`: literal braces are doubled)."""
        assert self.instance_prompt is not None
        try:
            return self.instance_prompt.format(problem_statement=problem_statement, working_dir=working_dir)
        except (KeyError, IndexError) as e:
            raise ConfigError(
                f"prompts {self.path}: instance_prompt uses the placeholder {e}; kvagent fills only "
                "{problem_statement} and {working_dir} (write literal braces as {{ and }})"
            ) from None
        except ValueError as e:
            raise ConfigError(
                f"prompts {self.path}: instance_prompt is not a valid format string ({e})"
            ) from None


KVAGENT_KEYS = ("steps_remaining", "final_steps_notice", "no_call_message")
PROMPT_KEYS = ("system_prompt", "instance_prompt", *KVAGENT_KEYS)


def load_prompt_file(path: str | Path) -> PromptFile:
    """Read and check a prompt file; a ConfigError names the problem and the fix."""
    import yaml

    p = Path(path).expanduser()
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            f"prompts: {path} does not exist; pass a YAML file with system_prompt and instance_prompt"
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"prompts: cannot read {path} ({e})") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"prompts: {path} is not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"prompts: {path} must hold a mapping with system_prompt and instance_prompt")
    unknown = sorted(k for k in data if k not in PROMPT_KEYS and k not in R2EGYM_OTHER_KEYS)
    if unknown:
        raise ConfigError(
            f"prompts {path}: unknown key {unknown[0]!r}; the keys are {', '.join(PROMPT_KEYS)}"
        )
    texts = {k: data[k] for k in PROMPT_KEYS if data.get(k) is not None}
    bad = [k for k, v in texts.items() if not isinstance(v, str)]
    if bad:
        raise ConfigError(f"prompts {path}: {bad[0]} must be a string")
    if not texts.get("system_prompt") or not texts.get("instance_prompt"):
        raise ConfigError(f"prompts {path}: system_prompt and instance_prompt are both required")
    if "{problem_statement}" not in texts["instance_prompt"]:
        raise ConfigError(
            f"prompts {path}: instance_prompt has no {{problem_statement}} placeholder for the issue"
        )
    if "{remaining}" not in texts.get("steps_remaining", "{remaining}"):
        raise ConfigError(f"prompts {path}: steps_remaining needs a {{remaining}} placeholder for the count")
    prompt = PromptFile(path=str(p), **texts)
    prompt.instance("", "/testbed")  # placeholders checked now, not at the first episode
    return prompt
