"""diff(): edits, new and deleted files round-trip through `git apply` onto a fresh base checkout."""

from __future__ import annotations

import subprocess
from pathlib import Path

from kvagent.sandbox.gitdiff import drop_binary


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
