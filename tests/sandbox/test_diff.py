"""diff(): edits, new and deleted files round-trip through `git apply` onto a fresh base checkout."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from kvagent.sandbox.gitdiff import drop_binary

from .conftest import BACKENDS, open_backend


def tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(root).parts
    }


def test_diff_round_trip(sandbox, repo, tmp_path):
    sb = sandbox
    sb.run_tool(
        "file_editor", {"command": "str_replace", "path": "a.py", "old_str": "a + b", "new_str": "b + a"}
    )
    sb.write("pkg/new_module.py", "X = 'ünïcode'\n")
    sb.write("new dir/with space.txt", "spaced\n")
    sb.run("rm README.md && printf 'no newline' > docs/guide.txt && touch empty.txt", timeout=30)
    sb.run("printf '\\x00\\x01\\x02' > blob.bin && mkdir -p __pycache__", timeout=30)
    patch = sb.diff()
    assert "blob.bin" not in patch and "Binary files" not in patch
    assert "pkg/new_module.py" in patch and "deleted file mode" in patch

    fresh = tmp_path / "fresh"
    subprocess.run(["git", "clone", "-q", str(repo), str(fresh)], check=True)
    (tmp_path / "p.diff").write_text(patch)
    subprocess.run(["git", "apply", "--check", str(tmp_path / "p.diff")], cwd=fresh, check=True)
    subprocess.run(["git", "apply", str(tmp_path / "p.diff")], cwd=fresh, check=True)

    # The sandbox tree (minus the binary file) equals the patched checkout.
    listing = sb.run("find . -path ./.git -prune -o -type f -printf '%P\\0'", timeout=30).output.split("\0")
    expected = {p: sb.read_bytes(p) for p in listing if p and p != "blob.bin"}
    assert tree(fresh) == expected
    # The diff does not disturb the sandbox's own index.
    assert "??" in sb.run("git status --porcelain", timeout=30).output


def test_no_changes_no_diff(sandbox):
    assert sandbox.diff() == ""


def test_diff_against_base_even_after_commit(sandbox):
    sandbox.write("a.py", "changed\n")
    sandbox.run("git add -A && git -c user.name=x -c user.email=x@x commit -qm agent", timeout=30)
    assert "+changed" in sandbox.diff()


def test_drop_binary_keeps_text_sections():
    text = "diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n"
    binary = "diff --git a/y.bin b/y.bin\nnew file mode 100644\nindex 0000000..1111111\nBinary files /dev/null and b/y.bin differ\n"
    assert drop_binary(text + binary + text) == text + text
    assert drop_binary("") == ""


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_utf8_and_crlf_files_round_trip(backend, repo, tmp_path, request):
    """A Latin-1 file's section is not UTF-8: decoded as text its bytes would become U+FFFD and the
    patch would not apply, so it comes as a git binary patch (paths with spaces and glob characters
    too); a CRLF file keeps its `\\r`. The patched checkout then equals the sandbox's files."""
    latin = {
        "latin.py": "# café\nx = 1\n",
        "sp ace/l[a]t*.py": "# naïve\ny = 1\n",
        "crlf.py": "a = 1\r\nb = 2\r\n",
    }
    for rel, text in latin.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_bytes(text.encode("latin-1"))
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "bytes"], cwd=repo, check=True
    )
    edits = {
        "latin.py": "# café\nx = 2\n".encode("latin-1"),
        "sp ace/l[a]t*.py": "# naïve\ny = 2\n".encode("latin-1"),
        "crlf.py": b"a = 1\r\nb = 3\r\n",
        "new_latin.py": "z = 'é'\n".encode("latin-1"),
    }
    with open_backend(backend, repo, request) as sb:
        for rel, data in edits.items():
            sb.write_bytes(rel, data)
        patch = sb.diff()
    assert "\ufffd" not in patch and "GIT binary patch" in patch
    assert "-b = 2\r\n+b = 3\r\n" in patch
    fresh = tmp_path / "fresh"
    subprocess.run(["git", "clone", "-q", str(repo), str(fresh)], check=True)
    (tmp_path / "p.diff").write_bytes(patch.encode("utf-8"))
    subprocess.run(["git", "apply", str(tmp_path / "p.diff")], cwd=fresh, check=True)
    for rel, data in edits.items():
        assert (fresh / rel).read_bytes() == data, rel


def test_r2egym_diff_stages_nothing(sandbox):
    """R2E-Gym's `git add -A && git diff --cached` runs on a copy of the index: the new file is in its
    output, and the tree's `git status` still shows it untracked."""
    sandbox.write("fresh.py", "x = 1\n")
    r = sandbox.r2egym_diff()
    assert r.exit_code == 0 and "diff --git a/fresh.py b/fresh.py\nnew file mode" in r.output
    assert sandbox.run("git status --porcelain", timeout=30).output == "?? fresh.py\n"
