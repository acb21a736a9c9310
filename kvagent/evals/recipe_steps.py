"""A recipe's build steps: `env`, `pre_install` and `install`, checked, and as Dockerfile lines.

    "env": {"SETUPTOOLS_SCM_PRETEND_VERSION": "7.4.0"}   # set while building and in every run
    "pre_install": ["sed -i ... setup.cfg"]               # shell steps in /testbed, network off
    "install": "python -m pip install -e ."               # replaces the install step

Without `install` the image runs the install command of swebench's spec for the instance's repo
and version (offline: pip finds only the image's wheelhouse), then falls back to an editable
install without build isolation, then to a .pth file, so a project that cannot build offline
still imports from /testbed. The eval script reruns the same command, as the harness does.
swebench's `pre_install` steps mostly need apt and a network, so they are never run implicitly:
`kvagent images check` shows them, and a recipe copies those that work offline.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvagent.errors import KvagentError

# kvagent's own install, for projects whose spec install cannot run offline.
EDITABLE = "python -m pip install -q --no-build-isolation --no-deps -e ."
FIELDS = ("env", "pre_install", "install")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Steps:
    env: Mapping[str, str] = field(default_factory=dict)
    pre_install: tuple[str, ...] = ()
    install: str | None = None  # None: the spec's install (or kvagent's when there is no spec)

    def digest_payload(self) -> dict[str, Any]:
        return {"env": dict(self.env), "pre_install": list(self.pre_install), "install": self.install}


def parse_steps(raw: Mapping[str, Any], where: str) -> Steps:
    """The three fields from a recipe's JSON object; `where` names the recipe in errors."""
    env = raw.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise KvagentError(f'{where}: field \'env\' must map names to strings, e.g. {{"NAME": "value"}}')
    bad = [k for k in env if not _ENV_NAME.fullmatch(k)]
    if bad:
        raise KvagentError(
            f"{where}: field 'env' has an invalid variable name {bad[0]!r} (letters, digits, _)"
        )
    pre = raw.get("pre_install", [])
    if (
        isinstance(pre, str)
        or not isinstance(pre, list)
        or not all(isinstance(s, str) and s.strip() for s in pre)
    ):
        raise KvagentError(f"{where}: field 'pre_install' must be a list of shell commands (strings)")
    install = raw.get("install")
    if install is not None and (not isinstance(install, str) or not install.strip()):
        raise KvagentError(
            f"{where}: field 'install' must be a non-empty shell command; omit it for the spec's"
        )
    if any("\n" in s for s in [*pre, install or "", *env.values()]):
        raise KvagentError(f"{where}: 'env', 'pre_install' and 'install' take one line each; split the steps")
    return Steps(env=dict(env), pre_install=tuple(pre), install=install)


def steps_of(recipe: Any) -> Steps:
    """The steps of a loaded Recipe (fields kvagent's recipe reader keeps beside the known ones)."""
    cached = getattr(recipe, "steps", None)
    if isinstance(cached, Steps):
        return cached
    extra = getattr(recipe, "extra", {}) or {}
    return parse_steps(
        extra, f"recipe {recipe.instance_id!r} in {getattr(recipe, 'origin', '') or 'recipes'}"
    )


def install_command(steps: Steps, spec_install: str | None) -> str:
    """The install step the image and the eval script run."""
    return steps.install or spec_install or EDITABLE


def dockerfile_lines(steps: Steps, spec_install: str | None) -> tuple[str, str]:
    """(lines before the install RUN, the install shell command with its fallbacks) for the build.

    safe.directory '*': the tree may be owned by another uid than the one running git (a sandbox
    user, a bind mount), and git then refuses it, which setuptools_scm reads as "no version"."""
    pre = ["RUN git config --system --add safe.directory '*'"]
    if steps.env:
        pre.append("ENV " + " ".join(f"{k}={json.dumps(v)}" for k, v in steps.env.items()))
    for step in steps.pre_install:
        pre.append(f"RUN {step}")
    first = install_command(steps, spec_install)
    chain = [first] if steps.install else list(dict.fromkeys([first, EDITABLE]))
    tried = " || ".join(f"({c})" for c in chain)
    return "\n".join(pre), tried


def describe(steps: Steps, spec: Any) -> dict[str, Any]:
    """For reports: what the recipe sets and what swebench's spec would run."""
    return {
        "env": dict(steps.env),
        "pre_install": list(steps.pre_install),
        "install": install_command(steps, getattr(spec, "install", None)),
        "spec_pre_install": list(getattr(spec, "pre_install", ()) or ()),
        "spec_install": getattr(spec, "install", None),
        "spec_pip_packages": list((getattr(spec, "specs", None) or {}).get("pip_packages", [])),
    }
