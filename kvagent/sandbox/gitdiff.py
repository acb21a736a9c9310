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


def diff_script(
    base_commit: str, out_path: str, binary_attrs: str | None = None, paths: tuple[str, ...] = ()
) -> str:
    """Write `git diff BASE` of the whole working tree (untracked files too) to out_path; with
    `binary_attrs` (an attributes file, `binary_attributes`) only `paths`, as git binary patches."""
    if not re.fullmatch(r"[0-9a-f]{40,64}", base_commit):
        raise ValueError(f"bad base commit {base_commit!r}")
    out = shlex.quote(out_path)
    git, extra = GIT, ""
    if binary_attrs is not None:
        git = f"{GIT} --literal-pathspecs -c core.attributesFile={shlex.quote(binary_attrs)}"
        extra = " --binary -- " + " ".join(shlex.quote(p) for p in paths)
    return f"""set -e
real_index="$({GIT} rev-parse --git-path index)"
export GIT_INDEX_FILE="$(mktemp)"
trap 'rm -f "$GIT_INDEX_FILE"' EXIT
# Starting from the real index reuses its stat cache (fast on big repos); read-tree otherwise.
# cp -p keeps the index mtime, which git's racy-entry check compares file mtimes against.
if [ -f "$real_index" ]; then cp -p "$real_index" "$GIT_INDEX_FILE"; else {GIT} read-tree {base_commit}; fi
{GIT} add -A
{git} diff --cached {base_commit} --no-color --no-ext-diff --no-textconv --no-renames \\
  --src-prefix=a/ --dst-prefix=b/{extra} > {out}
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


def _sections(patch: bytes) -> list[bytes]:
    starts = [m.start() for m in re.finditer(rb"^diff --git ", patch, re.MULTILINE)]
    return [patch[: starts[0]] if starts else patch] + [
        patch[s : starts[i + 1] if i + 1 < len(starts) else len(patch)] for i, s in enumerate(starts)
    ]


def _path(section: bytes) -> str | None:
    """The path of a `--no-renames` section (`diff --git a/P b/P`), or None where it is quoted or
    not UTF-8 (such a section stays as it is)."""
    rest = section.split(b"\n", 1)[0][len(b"diff --git ") :]
    n = (len(rest) - 5) // 2
    if rest.startswith(b'"') or rest[:2] != b"a/" or rest[2 + n :] != b" b/" + rest[2 : 2 + n]:
        return None
    try:
        return rest[2 : 2 + n].decode("utf-8")
    except UnicodeDecodeError:
        return None


def undecodable_paths(patch: bytes) -> list[str]:
    """The files whose text section is not UTF-8 (a Latin-1 file): decoded to text, their bytes would
    be lost and the patch would no longer apply."""
    out = []
    for section in _sections(patch)[1:]:
        try:
            section.decode("utf-8")
        except UnicodeDecodeError:
            path = _path(section)
            if path is not None:
                out.append(path)
    return out


def binary_attributes(paths: list[str]) -> str:
    """A gitattributes file marking exactly these paths `binary` (patterns anchored, glob characters
    escaped, C-quoted), so `git diff --binary` writes them as base85 git binary patches."""
    lines = []
    for p in paths:
        pattern = "/" + re.sub(r"([*?\[\\])", r"\\\1", p)
        lines.append('"' + pattern.replace("\\", "\\\\").replace('"', '\\"') + '" binary\n')
    return "".join(lines)


def splice(patch: bytes, binary: bytes) -> bytes:
    """`patch` with each section that `binary` (the same diff of some files, as binary patches) has
    a section for replaced by that one."""
    by_path = {_path(s): s for s in _sections(binary)[1:]}
    parts = _sections(patch)
    return parts[0] + b"".join(by_path.get(_path(s), s) for s in parts[1:])
