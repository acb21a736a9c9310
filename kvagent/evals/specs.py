"""Each instance's eval script as the SWE-bench harness builds it, adapted to a kvagent sandbox.

Where the script comes from:
  1. the record's own `eval_script` (swebench 5 datasets and task repos carry one per instance);
  2. else swebench's per-(repo, version) specs: `MAP_REPO_VERSION_TO_SPECS`, `get_test_directives`
     (django's dotted labels, ...) and `make_eval_script_list_py`. swebench 5 no longer ships them,
     so the last release that does (SPECS_RELEASE) is downloaded once, like an sdist, and asked in
     a child process (`_swebench_specs_child.py`), since one interpreter holds one swebench.

The harness's script is kept line for line except where it assumes the official image:
  - `source /opt/miniconda3/bin/activate` / `conda activate testbed` are dropped: kvagent images
    put their venv on PATH and a sandbox's own setup prefix activates anything else;
  - `/testbed` becomes the sandbox's workdir and the upstream base commit becomes the sandbox's
    base commit (a kvagent image commits the sdist as its own base);
  - `git config --global --add safe.directory` becomes the same setting in the environment, so
    grading in a local sandbox never writes the user's ~/.gitconfig;
  - `git show` shows only the commit header: a kvagent base commit adds the whole source tree;
  - the `install` step is the recipe's when it has one, and is left out where the caller says so
    (a local checkout must not reinstall itself into the user's environment);
  - swebench 5's `record_test_exit_code` adds the test command's exit status, and a failed
    test_patch prints TEST_PATCH_FAILED so grading can name it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvagent.errors import KvagentError
from kvagent.evals.datasets import Instance
from kvagent.fileio import cache_dir

# The last swebench release whose code holds MAP_REPO_VERSION_TO_SPECS (5.0 moved them to data).
SPECS_RELEASE = "swebench==4.1.0"
SPECS_ENV = "KVAGENT_SWEBENCH_SPECS"  # a swebench 4.x wheel or unpacked tree to use instead
TEST_PATCH_FAILED = ">>>>> kvagent: test_patch did not apply"
_CONDA = ("source /opt/miniconda3/bin/activate", "conda activate testbed")
_CHILD = Path(__file__).with_name("_swebench_specs_child.py")


@dataclass(frozen=True)
class HarnessSpec:
    """What swebench says about one instance."""

    instance_id: str
    eval_script_list: tuple[str, ...]  # as the harness would run it, unadapted
    specs: Mapping[str, Any] = field(default_factory=dict)  # the (repo, version) spec, if known
    directives: tuple[str, ...] = ()
    origin: str = ""  # "record" or the swebench release the spec came from

    @property
    def test_cmd(self) -> str:
        return str(self.specs.get("test_cmd", ""))

    @property
    def test_command(self) -> str:
        """The line that runs the tests: the spec's test_cmd and the directives."""
        return " ".join([self.test_cmd, *self.directives]).strip()

    @property
    def install(self) -> str | None:
        return self.specs.get("install")

    @property
    def pre_install(self) -> tuple[str, ...]:
        return tuple(self.specs.get("pre_install", ()))


# ------------------------------------------------------------------------------------ the specs


def specs_source(log=lambda _m: None) -> Path:
    """The swebench 4.x distribution the specs are read from (downloaded once into the cache)."""
    override = os.environ.get(SPECS_ENV)
    if override:
        path = Path(override).expanduser()
        if not path.exists():
            raise KvagentError(f"{SPECS_ENV}={override} does not exist; point it at a swebench 4.x wheel")
        return path
    dest = cache_dir() / "swebench-specs"
    found = sorted(dest.glob("swebench-*.whl")) if dest.is_dir() else []
    if not found:
        log(f"downloading {SPECS_RELEASE} (the harness's per-repository specs)")
        dest.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=dest) as tmp:
            cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:"]
            proc = subprocess.run([*cmd, "-d", tmp, SPECS_RELEASE], capture_output=True, text=True)
            wheels = list(Path(tmp).glob("swebench-*.whl"))
            if proc.returncode != 0 or len(wheels) != 1:
                last = (proc.stderr.strip().splitlines() or ["no wheel"])[-1]
                raise KvagentError(
                    f"could not download {SPECS_RELEASE} for the harness specs ({last}); "
                    f"download its wheel and set {SPECS_ENV}=PATH"
                )
            os.replace(wheels[0], dest / wheels[0].name)  # atomic: a half download never looks cached
        found = sorted(dest.glob("swebench-*.whl"))
    return found[-1]


_MEMO: dict[str, HarnessSpec | None] = {}


def _memo_key(inst: Instance) -> str:
    blob = json.dumps([inst.instance_id, inst.repo, inst.version, inst.base_commit, inst.test_patch])
    return hashlib.sha256(blob.encode()).hexdigest()


def _from_record(inst: Instance) -> HarnessSpec:
    from swebench.harness.utils import parse_eval_script

    return HarnessSpec(inst.instance_id, tuple(parse_eval_script(inst.extra["eval_script"])), origin="record")


def harness_specs(instances: Iterable[Instance], log=lambda _m: None) -> dict[str, HarnessSpec | None]:
    """swebench's spec for each instance; None for one whose (repo, version) swebench does not know."""
    instances = list(instances)
    out: dict[str, HarnessSpec | None] = {}
    ask = []
    for inst in instances:
        key = _memo_key(inst)
        if key in _MEMO:
            out[inst.instance_id] = _MEMO[key]
        elif isinstance(inst.extra.get("eval_script"), str):
            out[inst.instance_id] = _MEMO[key] = _from_record(inst)
        else:
            ask.append(inst)
    if ask:
        source = specs_source(log)
        payload = [
            {k: getattr(i, k) for k in ("instance_id", "repo", "version", "base_commit", "test_patch")}
            for i in ask
        ]
        proc = subprocess.run(
            [sys.executable, str(_CHILD), str(source)],
            input=json.dumps(payload),
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
            raise KvagentError(f"reading swebench's specs from {source.name} failed: {last}")
        answers = json.loads(proc.stdout)
        for inst in ask:
            a = answers[inst.instance_id]
            spec = None
            if "error" not in a:
                spec = HarnessSpec(
                    inst.instance_id,
                    tuple(a["eval_script_list"]),
                    specs=a["specs"],
                    directives=tuple(a["directives"]),
                    origin=source.name,
                )
            out[inst.instance_id] = _MEMO[_memo_key(inst)] = spec
    return out


def harness_spec(instance: Instance, log=lambda _m: None) -> HarnessSpec | None:
    return harness_specs([instance], log)[instance.instance_id]


def require_spec(instance: Instance, log=lambda _m: None) -> HarnessSpec:
    spec = harness_spec(instance, log)
    if spec is None:
        raise KvagentError(
            f"swebench has no spec for {instance.repo} version {instance.version!r} ({instance.instance_id}); "
            "give the recipe a 'test_cmd' or the record an 'eval_script'"
        )
    return spec


# ------------------------------------------------------------------------------ the adaptation


def adapt_eval_script(
    spec: HarnessSpec,
    *,
    base_commit: str,
    workdir: str = "/testbed",
    base_ref: str = "HEAD",
    install: str | None = None,
    env: Mapping[str, str] | None = None,
) -> str:
    """The harness's eval script for a kvagent sandbox (see the module docstring for each change).

    `base_commit`: the instance's upstream base commit (as it appears in the script); `base_ref`:
    the commit the sandbox's tree was made from; `install`: the step that replaces the spec's
    install line (None drops it); `env`: exported first (a recipe's `env`)."""
    from swebench.harness.constants import END_TEST_OUTPUT
    from swebench.harness.utils import record_test_exit_code

    wd = shlex.quote(workdir)
    spec_install = spec.install
    lines: list[str] = [f"export {k}={shlex.quote(v)}" for k, v in (env or {}).items()]
    for line in spec.eval_script_list:
        if line.strip() in _CONDA:
            continue
        if spec_install is not None and line == spec_install:
            if install:
                lines.append(install)
            continue
        if line.startswith("git config --global --add safe.directory"):
            # git reads these like `-c safe.directory=...`, without touching any config file.
            lines.append(f"export GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=safe.directory GIT_CONFIG_VALUE_0={wd}")
            continue
        if line.startswith("git apply") and "<<" in line:
            # `cmd <<'EOF' || other` is one command; the heredoc body follows on the next lines.
            head, _, body = line.partition("\n")
            line = f"{head} || echo '{TEST_PATCH_FAILED}'\n{body}"
        if line == "git show":
            line = "git show --no-patch"
        if line.startswith("cd /testbed"):
            line = f"cd {wd}" + line[len("cd /testbed") :]
        if base_commit and line.startswith(("git checkout ", "git -c core.fileMode=false diff ")):
            line = line.replace(base_commit, shlex.quote(base_ref))
        lines.append(line)
    if not any(END_TEST_OUTPUT in ln for ln in lines):
        raise KvagentError(f"{spec.instance_id}: the harness's eval script has no {END_TEST_OUTPUT!r} marker")
    return "\n".join(["#!/bin/bash", "set -uxo pipefail", *record_test_exit_code(lines)]) + "\n"


def sandbox_eval_script(
    instance: Instance, workdir: str, *, steps: Any = None, run_install: bool = True, log=lambda _m: None
) -> str | None:
    """The harness's eval script for `instance` in a sandbox whose tree is at HEAD; None when
    swebench has no spec for it (grading then runs the recipe's test command). `steps`: the
    recipe's `recipe_steps.Steps`; `run_install`: False where reinstalling would touch the user's
    environment (a local checkout)."""
    from kvagent.evals.recipe_steps import Steps, install_command

    spec = harness_spec(instance, log)
    if spec is None:
        return None
    steps = steps or Steps()
    return adapt_eval_script(
        spec,
        base_commit=instance.base_commit,
        workdir=workdir,
        base_ref="HEAD",
        install=install_command(steps, spec.install) if run_install else None,
        env=steps.env,
    )
