"""Make a private copy of a user's repository without ever writing to it."""

from __future__ import annotations

import shutil
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


def copy_repo(src: Path, dst: Path) -> None:
    """Clone HEAD of a git repo (uncommitted changes are not carried), else copy the tree.

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
    else:
        shutil.copytree(src, dst, symlinks=True)
