"""What a local (bubblewrap) sandbox shows: the mount arguments, built from an empty root up.

Nothing of the host is visible unless listed here: the system directories (read-only), /etc
without its secrets, the Python the tools run with (its install prefixes only), the paths the
user named, a private /tmp and the sandbox's own directory. See docs/sandbox.md.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterable

from kvagent.sandbox.errors import SandboxError

# Top-level entries of / that programs need; each is bound read-only (or re-made as the same
# symlink, for merged-/usr systems where /bin -> usr/bin).
VAR_TMP = "var-tmp"  # in the sandbox dir, shown at /var/tmp
SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
# Entries of /etc left out by name: password hashes, host keys, who may sudo, the Docker daemon's
# config and keys; no command of an agent needs them. Anything not world-readable is left out too.
ETC_SECRETS = frozenset({"shadow", "shadow-", "gshadow", "gshadow-", "ssh", "sudoers", "sudoers.d", "docker"})


def _world_readable(st: os.stat_result) -> bool:
    need = stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(st.st_mode) else 0)
    return st.st_mode & need == need


def _under(path: str, roots: Iterable[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def system_args(root: str = "/") -> list[str]:
    args: list[str] = []
    for name in SYSTEM_DIRS:
        src = os.path.join(root, name)
        if os.path.islink(src):
            args += ["--symlink", os.readlink(src), f"/{name}"]
        elif os.path.isdir(src):
            args += ["--ro-bind", src, f"/{name}"]
    return args


def etc_args(readonly: list[str], etc: str = "/etc") -> list[str]:
    """/etc as a tmpfs holding the host's world-readable entries, secrets left out; the tmpfs
    and the covers go on `readonly`, remounted read-only once the user's binds are in place."""
    args = ["--tmpfs", "/etc"]
    visible = ["/" + d for d in SYSTEM_DIRS] + ["/etc", "/proc", "/dev"]
    for name in sorted(os.listdir(etc)):
        src = os.path.join(etc, name)
        dst = f"/etc/{name}"
        if name in ETC_SECRETS:
            continue
        try:
            lst = os.lstat(src)
            if stat.S_ISLNK(lst.st_mode):
                real = os.path.realpath(src)
                if _under(real, visible) or not os.path.exists(real):
                    args += ["--symlink", os.readlink(src), dst]  # e.g. localtime -> /usr/share/...
                    continue
                src = real  # e.g. resolv.conf -> /run/...: show the file, not the rest of /run
            st = os.stat(src)
        except OSError:
            continue
        if not _world_readable(st):
            continue
        args += ["--ro-bind", src, dst]
        if stat.S_ISDIR(st.st_mode):
            args += _hide_unreadable(src, dst, readonly)
    readonly.append("/etc")
    return args


def _hide_unreadable(src: str, dst: str, readonly: list[str]) -> list[str]:
    """Cover what only its owner may read (ssl/private, docker keys): owner bits still apply
    to the invoking user inside the user namespace, so a bound file would be readable."""
    args: list[str] = []
    for top, dirs, files in os.walk(src):
        for name in [*dirs, *files]:
            path = os.path.join(top, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode) or _world_readable(st):
                continue
            inside = dst + path[len(src) :]
            if stat.S_ISDIR(st.st_mode):
                dirs.remove(name)
                args += ["--tmpfs", inside]
                readonly.append(inside)
            else:
                args += ["--ro-bind", "/dev/null", inside]
    return args


def interpreter_prefixes() -> list[str]:
    """Install prefixes of the Python the tools run with (a venv and the Python it was made from),
    outermost only, leaving out those the system directories already show."""
    candidates = {sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    shown = ["/" + d for d in SYSTEM_DIRS]
    out: list[str] = []
    for path in sorted(os.path.realpath(p) for p in candidates):
        if path == "/" or _under(path, shown) or _under(path, out):
            continue
        out.append(path)
    return out


def check_binds(paths: Iterable[str | os.PathLike] | None, option: str) -> tuple[str, ...]:
    """Absolute, existing host paths, each shown inside at the same path."""
    if paths is None:
        return ()
    if isinstance(paths, (str, os.PathLike)):
        raise SandboxError(f"{option}= takes a list of paths; write {option}=[{str(paths)!r}]")
    out = []
    for p in paths:
        path = os.path.abspath(os.path.expanduser(os.fspath(p)))
        if path == "/":
            raise SandboxError(f"{option}=['/'] would show the whole host; use isolation='none' instead")
        if not os.path.exists(path):
            raise SandboxError(f"{option} path {str(p)!r} does not exist; create it or drop it from {option}")
        out.append(path)
    return tuple(out)


def layout(root: str, tools_dir: str, bind: tuple[str, ...] = (), bind_rw: tuple[str, ...] = ()) -> list[str]:
    """bwrap mount arguments; later mounts go on top of earlier ones, so the order matters. The
    tmpfs parts are made read-only last: a bind needs its mount point created first."""
    readonly: list[str] = []
    args = ["--tmpfs", "/", *system_args(), *etc_args(readonly), "--dev", "/dev", "--proc", "/proc"]
    args += ["--tmpfs", "/tmp"]
    for path in interpreter_prefixes():
        args += ["--ro-bind", path, path]
    for path in bind:
        args += ["--ro-bind", path, path]
    for path in bind_rw:
        args += ["--bind", path, path]
    args += ["--bind", root, root, "--ro-bind", tools_dir, tools_dir]
    # The sandbox's own /var/tmp, kept across its commands as a container's is (R2E-Gym's editor
    # keeps its undo history in /var/tmp/editor_state.json).
    args += ["--bind", os.path.join(root, VAR_TMP), "/var/tmp"]
    for path in [*readonly, "/"]:
        args += ["--remount-ro", path]
    return args


def visible_path(path_var: str, shown: Iterable[str]) -> str:
    """PATH with the entries the sandbox cannot see dropped (pyenv shims, ~/.cargo/bin ...) and the
    tools' interpreter first, so `python` inside is the one the tools use."""
    shown = [*("/" + d for d in SYSTEM_DIRS), *shown]
    first = os.path.dirname(sys.executable)
    kept = [first] if _under(os.path.realpath(first), shown) else []
    for entry in path_var.split(os.pathsep):
        if entry and entry not in kept and _under(os.path.realpath(entry), shown):
            kept.append(entry)
    return os.pathsep.join(kept) or "/usr/bin:/bin"
