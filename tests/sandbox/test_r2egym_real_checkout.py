"""Against a real R2E-Gym checkout (`KVAGENT_R2EGYM_CHECKOUT=~/src/R2E-Gym`; skipped without one):
the observations of kvagent's `--r2egym` path equal those of R2E-Gym's own code, loaded from that
checkout at run time (`Action.to_bashcmd`, the body of `DockerRuntime.run`, `Observation`), both
running the checkout's tools on copies of one repository, call after call (the editor's undo history
included), and the repositories end with the same diff. R2E-Gym's runtime runs here on the host, in a
copy of the repository, through the same interpreter the local sandbox falls back to; its editor needs
chardet in that interpreter. docs/deepswe.md has the docker run of the same comparison."""

from __future__ import annotations

import ast
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

from kvagent.agent import AgentConfig
from kvagent.agent.r2egym import bash_command
from kvagent.agent.scaffold import make_scaffold
from kvagent.sandbox import open_sandbox
from kvagent.sandbox.commands import R2EGYM_PATH

from .conftest import make_repo

CHECKOUT = os.environ.get("KVAGENT_R2EGYM_CHECKOUT")
pytestmark = pytest.mark.skipif(not CHECKOUT, reason="set KVAGENT_R2EGYM_CHECKOUT to an R2E-Gym checkout")

FILES = {
    "a.py": "def add(a, b):\n    return a + b\n\n\nTOTAL = add(1, 2)\n",
    "accents.py": "# Café, naïve, résumé\nNAME = 'crème brûlée'\n\n\ndef f():\n    return NAME\n",
    "pkg/__init__.py": "",
    "README.md": "hello\n",
}
CALLS = [
    ("file_editor", {"command": "view", "path": "/testbed"}),
    ("file_editor", {"command": "view", "path": "/testbed/accents.py"}),
    ("file_editor", {"command": "view", "path": "/testbed/README.md"}),
    ("file_editor", {"command": "str_replace", "path": "/testbed/accents.py", "old_str": "NAME\n", "new_str": "NAME.upper()\n"}),
    ("file_editor", {"command": "insert", "path": "/testbed/a.py", "insert_line": "1", "new_str": "# added"}),
    ("file_editor", {"command": "undo_edit", "path": "/testbed/a.py"}),
    ("file_editor", {"command": "bogus", "path": "/testbed/a.py"}),
    ("search", {"search_term": "NAME", "path": "/testbed"}),
    ("search", {"search_term": "add", "path": "/testbed/a.py"}),
    ("execute_bash", {"cmd": "echo hi; echo err >&2"}),
    ("execute_bash", {"cmd": "exit 3"}),
    ("execute_bash", {"cmd": "git status"}),
    ("execute_bash", {"cmd": "seq 1 200"}),
    ("finish", {"command": "submit"}),
]  # fmt: skip


def r2egym_code(root: Path):
    """(Action, Observation, run) from the checkout: `run` is DockerRuntime.run's own body,
    compiled alone (its module imports docker, kubernetes and swebench)."""
    sys.path.insert(0, str(root / "src"))
    try:
        from r2egym.agenthub.action import Action
        from r2egym.agenthub.observation import Observation
    finally:
        sys.path.remove(str(root / "src"))
    tree = ast.parse((root / "src/r2egym/agenthub/runtime/docker.py").read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DockerRuntime")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "run")
    ns = {"re": re, "concurrent": concurrent, "DOCKER_PATH": R2EGYM_PATH, "CMD_TIMEOUT": 120}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), "docker.py", "exec"), ns)
    return Action, Observation, ns["run"]


class HostContainer:
    """`container.exec_run` on the host: the tools from `bin` (R2E-Gym's /usr/local/bin), each run
    with this interpreter (their `#!/root/.venv/bin/python` is absent here, as in the sandbox)."""

    def __init__(self, bin_dir: Path, names: list[str]) -> None:
        self.bin, self.names = bin_dir, names

    def exec_run(self, cmd, workdir, stdout, stderr, environment):
        line = cmd[2]
        for name in self.names:
            line = line.replace(f"timeout 90 {name} ", f"timeout 90 {sys.executable} {self.bin}/{name} ", 1)
        env = {"PATH": f"{self.bin}:{environment['PATH']}"}
        p = subprocess.run(
            [*cmd[:2], line], cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        return types.SimpleNamespace(output=p.stdout, exit_code=p.returncode)


def test_observations_are_r2egyms_byte_for_byte(tmp_path):
    root = Path(CHECKOUT).expanduser()
    Action, Observation, run = r2egym_code(root)
    config = AgentConfig(scaffold="r2egym", r2egym_path=str(root))
    repo = make_repo(tmp_path / "repo", FILES)
    ref, bin_dir = tmp_path / "ref", tmp_path / "bin"
    shutil.copytree(repo, ref)
    bin_dir.mkdir()
    for name, data in config.tool_scripts:
        (bin_dir / name).write_bytes(data)
        (bin_dir / name).chmod(0o755)
    container = HostContainer(bin_dir, [n for n, _ in config.tool_scripts])
    runtime = types.SimpleNamespace(backend="docker", repo_path=str(ref), container=container, logger=None)
    runtime.logger = types.SimpleNamespace(error=lambda *a: None)
    scaffold = make_scaffold(config)
    with open_sandbox("local", repo=repo) as sb:
        scaffold.prepare(sb)
        for name, params in CALLS:
            ours = {k: v.replace("/testbed", sb.workdir) for k, v in params.items()}
            theirs = {k: v.replace("/testbed", str(ref)) for k, v in params.items()}
            mine = scaffold.observe(name, sb.run_command(bash_command(name, ours), 90), 90)
            action = Action(function_name=name, parameters=theirs)
            want = str(Observation(*run(runtime, action.to_bashcmd(), timeout=90), action))
            assert mine.replace(sb.workdir, "/testbed") == want.replace(str(ref), "/testbed"), (name, params)
        diff = sb.run("git diff").output
    assert diff == subprocess.run(["git", "diff"], cwd=ref, capture_output=True, text=True).stdout
