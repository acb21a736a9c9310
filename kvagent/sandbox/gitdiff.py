"""Git plumbing run inside a sandbox: record the base commit, and diff the tree against it.

Scripts are plain bash so they run unchanged in any backend; they never touch the repository's
own index (a temporary GIT_INDEX_FILE is used), so `git status` inside the sandbox is unaffected.
"""

from __future__ import annotations

import re
import shlex

# safe.directory: the tree may be owned by another uid (docker cp, mounted copies).
GIT = "git -c safe.directory='*' -c core.quotepath=off -c core.autocrlf=false"
IDENTITY = "-c user.name=kvagent -c user.email=kvagent@localhost -c commit.gpgsign=false"


def init_script() -> str:
    """Print HEAD's sha; if workdir is not the top of a git repo with a commit, snapshot it first."""
    return f"""set -e
top=$({GIT} rev-parse --show-toplevel 2>/dev/null || true)
if [ "$top" != "$(pwd -P)" ]; then {GIT} init -q . ; fi
if ! {GIT} rev-parse -q --verify HEAD >/dev/null 2>&1; then
  {GIT} add -A
  {GIT} {IDENTITY} commit -q --allow-empty --no-verify -m "kvagent base snapshot"
fi
{GIT} rev-parse HEAD
"""


def diff_script(base_commit: str, out_path: str) -> str:
    """Write `git diff BASE` of the whole working tree (untracked files too) to out_path."""
    if not re.fullmatch(r"[0-9a-f]{40,64}", base_commit):
        raise ValueError(f"bad base commit {base_commit!r}")
    out = shlex.quote(out_path)
    return f"""set -e
real_index="$({GIT} rev-parse --git-path index)"
export GIT_INDEX_FILE="$(mktemp)"
trap 'rm -f "$GIT_INDEX_FILE"' EXIT
# Starting from the real index reuses its stat cache (fast on big repos); read-tree otherwise.
# cp -p keeps the index mtime, which git's racy-entry check compares file mtimes against.
if [ -f "$real_index" ]; then cp -p "$real_index" "$GIT_INDEX_FILE"; else {GIT} read-tree {base_commit}; fi
{GIT} add -A
{GIT} diff --cached {base_commit} --no-color --no-ext-diff --no-textconv --no-renames \\
  --src-prefix=a/ --dst-prefix=b/ > {out}
"""


_SECTION = re.compile(r"^diff --git ", re.MULTILINE)
_BINARY = re.compile(r"^Binary files .* differ$", re.MULTILINE)


def drop_binary(patch: str) -> str:
    """Remove file sections git reports as binary: they cannot be applied from a text patch."""
    starts = [m.start() for m in _SECTION.finditer(patch)]
    if not starts:
        return patch
    pieces = [patch[: starts[0]]]
    for i, s in enumerate(starts):
        section = patch[s : starts[i + 1] if i + 1 < len(starts) else len(patch)]
        header = section.split("\n@@", 1)[0]
        if not _BINARY.search(header):
            pieces.append(section)
    return "".join(pieces)
