"""`--r2egym PATH`: R2E-Gym's own tool scripts, read from the user's checkout, for the sandbox to
install where R2E-Gym installs them (sandbox/commands.py). Which scripts: the `command_files` of the
checkout's prompt file (the list R2E-Gym's agent hands its environment), paths taken from the
checkout's root as R2E-Gym takes them from its working directory. Each is compiled here (nothing of
it runs on the host), so a missing or broken tool is one line before the first episode; whether
its imports (chardet) resolve is checked in the sandbox, where it runs."""

from __future__ import annotations

from pathlib import Path

from kvagent.agent import r2egym
from kvagent.errors import ConfigError

FIX = "pass the root of an unmodified R2E-Gym checkout, or drop --r2egym to use kvagent's own r2egym tools"


def _refuse(root: Path, what: str) -> ConfigError:
    return ConfigError(f"r2egym: {root}: {what}; {FIX}")


def command_name(rel: str) -> str:
    """The command a tool file becomes: its file name without `.py` (R2E-Gym's `add_commands`)."""
    name = Path(rel).name
    return name[:-3] if name.endswith(".py") else name


def load_tools(root: str | Path, prompt_file: Path) -> tuple[tuple[str, bytes], ...]:
    """(command name, script bytes) for every tool of `prompt_file`'s `command_files`; a
    ConfigError (one line) when the list, a file, or a tool the protocol calls is missing, or a
    script does not compile."""
    import yaml

    root = Path(root).expanduser()
    try:
        files = yaml.safe_load(prompt_file.read_text(encoding="utf-8")).get("command_files")
    except (OSError, UnicodeDecodeError, AttributeError, yaml.YAMLError) as e:
        raise _refuse(root, f"cannot read command_files of {prompt_file} ({type(e).__name__})") from None
    if not isinstance(files, list) or not files or not all(isinstance(f, str) for f in files):
        raise _refuse(root, f"{prompt_file.name} lists no command_files (R2E-Gym's tool scripts)")
    tools: dict[str, bytes] = {}
    for rel in files:
        path = (root / rel).resolve()
        if not path.is_relative_to(root.resolve()):
            raise _refuse(root, f"command file {rel} lies outside the checkout")
        try:
            data = path.read_bytes()
        except OSError:
            raise _refuse(root, f"no tool script {rel} (listed in {prompt_file.name})") from None
        try:
            compile(data, str(path), "exec", dont_inherit=True)  # what `python -m py_compile` checks
        except (SyntaxError, ValueError) as e:
            raise _refuse(root, f"tool script {rel} does not compile ({type(e).__name__}: {e})") from None
        tools[command_name(rel)] = data
    missing = [t for t in r2egym.TOOLS if t not in tools]
    if missing:
        raise _refuse(root, f"command_files has no {', '.join(missing)} tool")
    return tuple(tools.items())
