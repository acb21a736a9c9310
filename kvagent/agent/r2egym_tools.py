"""`--r2egym PATH`: R2E-Gym's own tool scripts, read from the user's checkout, for the sandbox to
install where R2E-Gym installs them (sandbox/commands.py). Which scripts: the `command_files` of the
checkout's prompt file (the list R2E-Gym's agent hands its environment), paths taken from the
checkout's root as R2E-Gym takes them from its working directory. Each is compiled here (nothing of
it runs on the host), so a missing or broken tool is one line before the first episode; whether
its imports (chardet) resolve is checked in the sandbox, where it runs."""

from __future__ import annotations

import re
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


# ------------------------------------------------------------------------------ chardet, as R2E-Gym
# R2E-Gym's runtime runs `python -m pip install chardet` in a SWE-bench image (its own images have
# it): the newest release then, which its uv.lock pins for itself. kvagent takes the same release
# cap from the checkout's uv.lock and pip's choice under it for the task's Python (3.6 gets 5.0.0).
CHARDET_PYTHONS = ("3.6", "3.7")  # the wheels differ only across 3.6 / 3.7+ (chardet 5.1 needs 3.7)
_LOCKED = re.compile(r'\[\[package\]\]\nname = "chardet"\nversion = "([^"]+)"')


def chardet_cap(root: str | Path) -> str | None:
    """The chardet release of the checkout's uv.lock, or None without one."""
    try:
        m = _LOCKED.search((Path(root).expanduser() / "uv.lock").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return None
    return m.group(1) if m else None


def chardet_wheels(cap: str) -> tuple[tuple[str, bytes], ...]:
    """(lowest Python, wheel bytes) of `chardet<=cap` for Python 3.6 and 3.7+, as pip picks them from
    the registry; downloaded once into the kvagent cache. A ConfigError (one line) if pip cannot."""
    import subprocess
    import sys

    from kvagent.fileio import cache_dir

    out = []
    for python in CHARDET_PYTHONS:
        dest = cache_dir() / "wheels" / f"chardet-le-{cap}-py{python}"
        if not list(dest.glob("chardet-*.whl")):
            cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:"]
            cmd += ["--python-version", python, "-d", str(dest), f"chardet<={cap}"]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
                raise ConfigError(
                    f"r2egym: cannot download chardet<={cap} for R2E-Gym's editor ({last}); "
                    "reach PyPI once (the wheel is cached), or drop --r2egym"
                )
        out.append((python, sorted(dest.glob("chardet-*.whl"))[-1].read_bytes()))
    return tuple(out)
