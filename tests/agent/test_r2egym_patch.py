"""R2E-Gym's patch rule, the graded patch under --scaffold r2egym: only `.py` files, and only those
edited with file_editor str_replace (all `.py` files when no str_replace was made). Both patches are
in the result, the graded one named; `patch_rule="full"` grades the whole diff. Run for real: the
r2egym tools in a local sandbox, a scripted model."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import pytest

from kvagent.agent import AgentConfig, load_trajectory, run_episode, write_trajectory
from kvagent.agent.r2egym import edited_paths, graded_patch, output_patch
from kvagent.sandbox import open_sandbox
from kvagent.testing import ScriptedSession, git_repo
from tests.helpers import SUBMIT, call

FILES = {"a.py": "x = 1\n", "pkg/b.py": "y = 2\n", "README.md": "hello\n"}
EDIT_A = call("file_editor", command="str_replace", path="/testbed/a.py", old_str="x = 1", new_str="x = 10")
CREATE_C = call("file_editor", command="create", path="/testbed/c.py", file_text="z = 3\n")
SHELL_EDITS = call("execute_bash", cmd="sed -i s/2/20/ pkg/b.py && echo bye >> README.md")


def run(tmp_path, tokenizer, replies, files=FILES, raw=None, **config):
    repo = tmp_path / "repo"
    for rel, data in (raw or {}).items():  # bytes files (CRLF, Latin-1), committed with the rest
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_bytes(data)
    git_repo(repo, files)
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

    def r2egym_diff(self, timeout=120):
        return self.sb.r2egym_diff(timeout)


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


# ------------------------------------------------------------- renames, deletions, CRLF, Latin-1
# The scratch repository of issue #57: weird.py renamed, a new q.py, a CRLF and a Latin-1 file edited.
RAW = {
    "weird.py": b"def w():\n    return 1\n" * 5,
    "crlf.py": b"a = 1\r\nb = 2\r\n",
    "latin.py": "# caf\xe9\nx = 1\n".encode("latin-1"),
}
RENAME = call("execute_bash", cmd="mv weird.py weird2.py")
EDITS = call(
    "execute_bash",
    cmd="printf 'q = 1\\n' > q.py; printf 'a = 1\\r\\nb = 3\\r\\n' > crlf.py; "
    "printf '# caf\\351\\nx = 2\\n' > latin.py; echo more >> README.md",
)
# R2E-Gym counts a str_replace call whether or not it edits (this one misses): crlf.py is "edited"
# and keeps the CRLF lines the shell wrote (its editor would rewrite them with LF).
EDIT_CRLF = call("file_editor", command="str_replace", path="/testbed/crlf.py", old_str="absent", new_str="x")


def applies(tmp_path, patch: str) -> bool:
    """Whether `patch` applies (git apply --check) to a fresh copy of the scratch repository."""
    repo = Path(tempfile.mkdtemp(dir=tmp_path)) / "fresh"
    for rel, data in RAW.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_bytes(data)
    git_repo(repo, FILES)
    (repo.parent / "p.diff").write_bytes(patch.encode("utf-8"))
    check = subprocess.run(["git", "-C", str(repo), "apply", "--check", "../p.diff"], capture_output=True)
    return check.returncode == 0


def test_r2egym_refuses_the_rename_and_grades_its_whole_diff(tmp_path, tokenizer):
    """R2E-Gym's diff detects the rename; its graded-patch step refuses it and falls back to the whole
    `output_patch`: every file, non-.py ones, the new file and the rename, carriage returns removed."""
    result = run(tmp_path, tokenizer, [RENAME, EDITS, EDIT_CRLF], raw=RAW)
    graded = result.patches["r2egym"]
    assert result.patch == graded
    assert (
        "diff --git a/weird.py b/weird2.py\nsimilarity index 100%\nrename from weird.py\nrename to weird2.py"
        in graded
    )
    assert files_of(graded) == ["README.md", "crlf.py", "latin.py", "q.py", "weird2.py"]
    assert "\r" not in graded and "-b = 2\n+b = 3\n" in graded


def test_r2egym_strips_carriage_returns_so_a_crlf_section_no_longer_applies(tmp_path, tokenizer):
    """Without a rename R2E-Gym's rule holds: the str_replaced .py file only, written back by its parser
    (a trailing blank context line where the diff's last section is kept), `\r` removed: it does not
    apply. The default rule's patch of the same tree keeps `\r` and applies."""
    result = run(tmp_path, tokenizer, [EDITS, EDIT_CRLF], raw=RAW)
    graded = result.patches["r2egym"]
    assert files_of(graded) == ["crlf.py"]
    assert "\r" not in graded and not applies(tmp_path, graded)
    crlf = result.patches["full"].split("diff --git a/crlf.py")[1].split("diff --git")[0]
    assert "-b = 2\r\n+b = 3\r\n" in crlf and applies(tmp_path, crlf)


def test_default_rule_grades_deletions_and_new_files(tmp_path, tokenizer):
    """Under the default rule the graded patch holds the deletion of weird.py (a module the tests may
    import) beside the new weird2.py and q.py, and the CRLF edit with its `\r`; it applies."""
    result = run(tmp_path, tokenizer, [RENAME, EDITS, EDIT_CRLF], raw=RAW, patch_rule="full")
    patch = result.patch
    assert files_of(patch) == ["README.md", "crlf.py", "latin.py", "q.py", "weird.py", "weird2.py"]
    assert "diff --git a/weird.py b/weird.py\ndeleted file mode 100644" in patch
    assert "diff --git a/weird2.py b/weird2.py\nnew file mode 100644" in patch
    assert "diff --git a/q.py b/q.py\nnew file mode 100644" in patch
    assert "-b = 2\r\n+b = 3\r\n" in patch
    assert applies(tmp_path, patch)  # the Latin-1 file's section as a git binary patch


def test_graded_patch_is_written_back_as_r2egyms_parser_writes_it():
    """R2E-Gym parses its diff and writes each kept section back: the empty string after the diff's last
    newline becomes one more context line (" ") of the last hunk; quotes around a path are dropped
    (its escapes kept); a rename or an unknown header line makes it grade the whole diff."""
    last = (
        "diff --git a/z.py b/z.py\nindex 1..2 100644\n--- a/z.py\n+++ b/z.py\n@@ -1 +1 @@ def f():\n-a\n+b\n"
    )
    assert graded_patch(last, []) == last + " \n"
    quoted = 'diff --git "a/caf\\303\\251.py" "b/caf\\303\\251.py"\nnew file mode 100644\nindex 0..1\n'
    assert (
        graded_patch(quoted, [])
        == "diff --git a/caf\\303\\251.py b/caf\\303\\251.py\nnew file mode 100644\nindex 0..1\n"
    )
    renamed = "diff --git a/w.py b/w2.py\nsimilarity index 100%\nrename from w.py\nrename to w2.py\n"
    assert graded_patch(DIFF + renamed, ["a.py"]) == DIFF + renamed
    assert graded_patch("warning: x\n" + DIFF, ["a.py"]) == graded_patch(
        DIFF, ["a.py"]
    )  # text before: ignored


def test_output_patch_of_a_failing_environment_is_the_error_text():
    """R2E-Gym's `run` returns an exception's text as the command's output; the episode still ends
    with both patches (the r2egym one that text) rather than an exception at its end."""

    class Broken:
        def r2egym_diff(self, timeout):
            raise RuntimeError("container gone")

    assert output_patch(Broken(), "x") == "Error: RuntimeError('container gone')"
    assert output_patch(object(), "a\r\nb\r\n") == "a\nb\n"  # no such method: the full diff, no \r
