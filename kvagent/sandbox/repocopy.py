"""Make a private copy of a user's repository without ever writing to it.

A git checkout is cloned at HEAD, then its working tree is laid over the clone: uncommitted
edits, deletions, staged files and untracked files that are not ignored, exactly as the user
sees them. They are committed in the copy as its base, so the agent starts from the user's
tree and its patch holds only its own changes (and applies to that tree).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path

from kvagent.sandbox.errors import SandboxError


def _git_root(path: Path) -> Path | None:
    import git

    try:
        repo = git.Repo(path)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        return None
    if repo.bare or repo.working_tree_dir is None:
        return None
    if Path(repo.working_tree_dir).resolve() != path.resolve():
        return None  # a sub-directory of a repository: copied as a plain tree
    try:
        repo.head.commit  # noqa: B018 - unborn HEAD raises here
    except ValueError:
        return None
    return path


def check_repo(repo: str | Path) -> Path:
    src = Path(repo).expanduser()
    if not src.is_dir():
        raise SandboxError(f"repository path {str(repo)!r} is not a directory; pass an existing checkout")
    return src.resolve()


log = logging.getLogger(__name__)
# Plain git, never taking the user's index lock nor refreshing their index.
GIT_ENV = {"GIT_OPTIONAL_LOCKS": "0", "GIT_TERMINAL_PROMPT": "0"}
IDENTITY = ["-c", "user.name=kvagent", "-c", "user.email=kvagent@localhost", "-c", "commit.gpgsign=false"]


def _git(cwd: Path, *args: str) -> str:
    r = subprocess.run(
        ["git", "-c", "core.quotepath=off", *args],
        cwd=cwd,
        capture_output=True,
        env={**os.environ, **GIT_ENV},
        timeout=300,
    )
    if r.returncode != 0:
        err = r.stderr.decode(errors="replace").strip()[-200:]
        raise SandboxError(f"git {args[0]} in {cwd} failed ({err}); check the repository")
    return r.stdout.decode("utf-8", errors="surrogateescape")


def _paths(out: str) -> list[str]:
    return [p for p in out.split("\0") if p]


def overlay_worktree(src: Path, dst: Path) -> tuple[int, int]:
    """Make the clone `dst` hold what `src`'s working tree holds; returns (changed, untracked)."""
    changed = _paths(_git(src, "diff", "HEAD", "--name-only", "--no-renames", "-z"))
    untracked = _paths(_git(src, "ls-files", "--others", "--exclude-standard", "-z"))
    for rel in [*changed, *untracked]:
        s, d = src / rel, dst / rel
        if os.path.isdir(d) and not os.path.islink(d):
            continue  # a submodule: its own checkout, not copied
        if os.path.lexists(d):
            os.unlink(d)
        if os.path.lexists(s) and not (os.path.isdir(s) and not os.path.islink(s)):
            d.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(s, d, follow_symlinks=False)
    if changed or untracked:
        _git(dst, "add", "-A")
        _git(
            dst,
            *IDENTITY,
            "commit",
            "-q",
            "--no-verify",
            "-m",
            "kvagent: uncommitted changes of the checkout",
        )
    return len(changed), len(untracked)


def copy_repo(src: Path, dst: Path) -> str:
    """Clone a git repo and lay its working tree over the clone, else copy the tree. Returns a
    line saying what uncommitted files came along ("" when none).

    A plain tree gets its base commit later, inside the sandbox (gitdiff.init_script).
    """
    import git

    if _git_root(src) is not None:
        try:
            # no_hardlinks: the copy must share no inode with the user's objects.
            clone = git.Repo.clone_from(str(src), str(dst), no_hardlinks=True)
        except git.GitCommandError as e:
            raise SandboxError(
                f"git clone of {src} failed ({e.stderr.strip()[-200:]}); check the repository"
            ) from e
        # Without a remote, a `git push` inside the sandbox cannot reach the user's checkout.
        for remote in list(clone.remotes):
            clone.delete_remote(remote)
        clone.close()
        changed, untracked = overlay_worktree(src, dst)
        if changed or untracked:
            note = (
                f"the sandbox copy of {src} includes its uncommitted changes ({changed} changed, "
                f"{untracked} untracked file(s)), committed there as the base; your checkout is untouched"
            )
            log.warning(note)
            return note
    else:
        shutil.copytree(src, dst, symlinks=True)
    return ""
