"""Against a real R2E-Gym checkout (`KVAGENT_R2EGYM_CHECKOUT=~/src/R2E-Gym`; skipped without one):
the observations of kvagent's `--r2egym` path equal those of R2E-Gym's own code, loaded from that
checkout at run time (`Action.to_bashcmd`, the body of `DockerRuntime.run`, `Observation`), both
running the checkout's tools on copies of one repository, call after call (the editor's undo history
included), and the repositories end with the same diff. R2E-Gym's runtime runs here on the host, in a
copy of the repository, through the same interpreter the local sandbox falls back to; its editor needs
chardet in that interpreter. docs/deepswe.md has the docker run of the same comparison. The graded
patch of a scratch repository (a rename, a new file, CRLF and Latin-1 edits) is compared with the
checkout's `DockerRuntime.get_patch` and `Trajectory.true_output_patch` the same way."""

from __future__ import annotations

import ast
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import types
from datetime import datetime
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


def class_functions(path: Path, cls_name: str, names: tuple[str, ...], ns: dict) -> dict:
    """The named methods of a class in one of the checkout's modules, compiled alone (decorators
    dropped) in `ns`: the parts of R2E-Gym's code a test needs without its module's imports."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls_name)
    fns = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name in names]
    for fn in fns:
        fn.decorator_list = []
    exec(compile(ast.Module(body=fns, type_ignores=[]), path.name, "exec"), ns)
    return {name: ns[name] for name in names}


def r2egym_patch_code(root: Path, run):
    """(get_patch, Trajectory): `DockerRuntime.get_patch` over the checkout's `run`, and a stand-in
    Trajectory whose `output_patch`, `editor_files`, `parsed_pred_commit` and `true_output_patch`
    are the checkout's own methods (its CommitParser and ParsedCommit included)."""
    sys.path.insert(0, str(root / "src"))
    try:
        from r2egym.agenthub.action import Action
        from r2egym.commit_models.parse_diff import CommitParser
    finally:
        sys.path.remove(str(root / "src"))
    src = root / "src/r2egym/agenthub"
    runtime = class_functions(src / "runtime/docker.py", "DockerRuntime", ("get_patch",), {})
    names = ("editor_files", "parsed_pred_commit", "true_output_patch")
    traj = class_functions(src / "trajectory/trajectory.py", "Trajectory", names, {
        "CommitParser": CommitParser, "datetime": datetime, "Action": Action})  # fmt: skip
    runtime_cls = type("Runtime", (), {"run": run, "get_patch": runtime["get_patch"]})
    return runtime_cls, type("Trajectory", (), {n: property(f) for n, f in traj.items()}), Action


PATCH_RAW = {
    "weird.py": b"def w():\n    return 1\n" * 5,
    "crlf.py": b"a = 1\r\nb = 2\r\n",
    "latin.py": "# caf\xe9\nx = 1\n".encode("latin-1"),
    "README.md": b"hello\n",
}
PATCH_EDITS = (
    "printf 'q = 1\\n' > q.py; printf 'a = 1\\r\\nb = 3\\r\\n' > crlf.py; "
    "printf '# caf\\351\\nx = 2\\n' > latin.py; echo more >> README.md"
)


@pytest.mark.parametrize(
    ("rename", "edited"),
    [
        (True, []),  # the rename: R2E-Gym's parser refuses it, the whole diff is graded
        (False, []),  # every .py file, each section written back by its parser
        (False, ["/testbed/crlf.py", "/testbed/README.md"]),  # the str_replaced .py file only
        (False, ["/testbed/q.py"]),  # the diff's last section kept: its trailing blank context line
    ],
)
def test_graded_patch_is_r2egyms(tmp_path, rename, edited):
    """kvagent's r2egym graded patch of a scratch repository (weird.py renamed or not, a new q.py, a
    CRLF and a Latin-1 file edited) equals R2E-Gym's `true_output_patch` over its `get_patch`, both
    from the checkout, on a copy edited the same way."""
    from kvagent.agent import r2egym

    root = Path(CHECKOUT).expanduser()
    _, _, run = r2egym_code(root)
    runtime_cls, trajectory_cls, Action = r2egym_patch_code(root, run)
    repo = tmp_path / "repo"
    repo.mkdir()
    for rel, data in PATCH_RAW.items():
        (repo / rel).write_bytes(data)
    make_repo(repo, {})
    ref = tmp_path / "ref"
    shutil.copytree(repo, ref)
    edits = ("mv weird.py weird2.py; " if rename else "") + PATCH_EDITS
    subprocess.run(["sh", "-c", edits], cwd=ref, check=True)
    runtime = runtime_cls()
    runtime.backend, runtime.repo_path = "docker", str(ref)
    runtime.container = HostContainer(tmp_path, [])
    runtime.logger = types.SimpleNamespace(error=lambda *a: None)
    traj = trajectory_cls()
    traj.output_patch, traj.ds = runtime.get_patch(), {}
    actions = [
        Action(function_name="file_editor", parameters={"command": "str_replace", "path": p}) for p in edited
    ]
    traj.trajectory_steps = [types.SimpleNamespace(action=a.to_xml_string()) for a in actions]
    with open_sandbox("local", repo=repo) as sb:
        sb.run(edits)
        full = sb.diff()
        mine = r2egym.graded_patch(r2egym.output_patch(sb, full), r2egym.edited_paths(
            [{"name": "file_editor", "params": {"command": "str_replace", "path": p}} for p in edited]))  # fmt: skip
    assert mine == traj.true_output_patch
    assert ("rename from weird.py" in mine) == rename
