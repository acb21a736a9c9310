"""R2E-Gym's patch rule, the graded patch under --scaffold r2egym: only `.py` files, and only those
edited with file_editor str_replace (all `.py` files when no str_replace was made). Both patches are
in the result, the graded one named; `patch_rule="full"` grades the whole diff. Run for real: the
r2egym tools in a local sandbox, a scripted model."""

from __future__ import annotations

import pytest

from kvagent.agent import AgentConfig, load_trajectory, run_episode, write_trajectory
from kvagent.agent.r2egym import edited_paths, graded_patch
from kvagent.sandbox import open_sandbox
from kvagent.testing import ScriptedSession, git_repo
from tests.helpers import SUBMIT, call

FILES = {"a.py": "x = 1\n", "pkg/b.py": "y = 2\n", "README.md": "hello\n"}
EDIT_A = call("file_editor", command="str_replace", path="/testbed/a.py", old_str="x = 1", new_str="x = 10")
CREATE_C = call("file_editor", command="create", path="/testbed/c.py", file_text="z = 3\n")
SHELL_EDITS = call("execute_bash", cmd="sed -i s/2/20/ pkg/b.py && echo bye >> README.md")


def run(tmp_path, tokenizer, replies, **config):
    repo = tmp_path / "repo"
    git_repo(repo, FILES)
    with open_sandbox("local", repo=repo) as sb:
        config = AgentConfig(scaffold="r2egym", repo_dir="/testbed", history="keep-thinking", **config)
        session = ScriptedSession(tokenizer, [*replies, SUBMIT])
        # the prompts name /testbed; the sandbox's own path is mapped there for the edits
        result = run_episode(session, PathMap(sb), "the bug", config, tokenizer=tokenizer)
    assert result.exit_status == "submitted", result.error
    return result


class PathMap:
    """The sandbox with /testbed in call paths read as its working tree (a local copy lives elsewhere)."""

    def __init__(self, sb):
        self.sb, self.workdir = sb, "/testbed"

    def run_tool(self, name, params, timeout=90):
        return self.sb.run_tool(
            name, {k: v.replace("/testbed", self.sb.workdir) for k, v in params.items()}, timeout
        )

    def diff(self):
        return self.sb.diff()


def files_of(patch):
    return sorted(line.split(" b/")[-1] for line in patch.splitlines() if line.startswith("diff --git "))


def test_graded_patch_is_the_str_replaced_py_files(tmp_path, tokenizer):
    result = run(tmp_path, tokenizer, [EDIT_A, CREATE_C, SHELL_EDITS])
    assert files_of(result.patches["full"]) == ["README.md", "a.py", "c.py", "pkg/b.py"]
    assert result.graded_patch == "r2egym" and result.patch == result.patches["r2egym"]
    assert files_of(result.patch) == ["a.py"]
    assert "+x = 10" in result.patch
    traj = load_trajectory(write_trajectory(tmp_path / "t.traj.json", result))
    assert (traj["graded_patch"], traj["patch"]) == ("r2egym", result.patch)
    assert traj["patches"] == result.patches


def test_without_str_replace_every_py_file_is_graded(tmp_path, tokenizer):
    result = run(tmp_path, tokenizer, [CREATE_C, SHELL_EDITS])
    assert files_of(result.patch) == ["c.py", "pkg/b.py"]


def test_patch_rule_full_grades_the_whole_diff(tmp_path, tokenizer):
    result = run(tmp_path, tokenizer, [EDIT_A, SHELL_EDITS], patch_rule="full")
    assert result.graded_patch == "full" and result.patch == result.patches["full"]
    assert files_of(result.patch) == ["README.md", "a.py", "pkg/b.py"]
    assert files_of(result.patches["r2egym"]) == ["a.py"]


def test_kvagent_scaffold_grades_the_whole_diff_by_default():
    assert AgentConfig().patch_rule == "full" and AgentConfig(scaffold="r2egym").patch_rule == "r2egym"


DIFF = """diff --git a/a.py b/a.py
index 1..2 100644
--- a/a.py
+++ b/a.py
@@ -1 +1 @@
-x = 1
+x = 10
diff --git a/gone.py b/gone.py
deleted file mode 100644
--- a/gone.py
+++ /dev/null
@@ -1 +0,0 @@
-old
diff --git a/run.py b/run.py
old mode 100644
new mode 100755
diff --git a/notes.txt b/notes.txt
--- a/notes.txt
+++ b/notes.txt
@@ -1 +1 @@
-a
+b
"""


@pytest.mark.parametrize(
    ("paths", "files"),
    [
        ([], ["a.py", "gone.py", "run.py"]),  # no str_replace: every .py file
        (["/testbed/a.py", "/testbed/notes.txt"], ["a.py"]),  # .py only, even when edited
        (["gone.py"], ["gone.py"]),  # relative paths count as given
        (["./a.py"], []),  # R2E-Gym compares paths as written: ./a.py is not a.py (odd, kept)
    ],
)
def test_graded_patch_rule(paths, files):
    calls = [{"name": "file_editor", "params": {"command": "str_replace", "path": p}} for p in paths]
    calls += [{"name": "file_editor", "params": {"command": "create", "path": "/testbed/new.py"}}, None]
    assert files_of(graded_patch(DIFF, edited_paths(calls, "/testbed"))) == files
