"""What goes into an instance image's build context: the source (a release sdist, cached once, or an
export of a git mirror) and a wheelhouse of the pins for the image's Python, so the build itself
runs with the network off."""

from __future__ import annotations

import io
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

from kvagent.errors import KvagentError
from kvagent.fileio import cache_dir


def wheel_platforms(glibc: str) -> tuple[str, ...]:
    """pip's --platform tags for an x86_64 image with that glibc (`2_31`: bullseye); pip widens a
    manylinux_2_X tag to every older manylinux one."""
    return (f"manylinux_{glibc}_x86_64", "linux_x86_64")


Log = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


def _run(cmd: Sequence[str], what: str, cwd: Path | None = None) -> str:
    proc = subprocess.run(list(cmd), cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip() and "WARNING" not in ln]
        raise KvagentError(f"{what} failed: {lines[-1] if lines else f'exit {proc.returncode}'}")
    return proc.stdout


def fetch_sdist(requirement: str, log: Log = _quiet) -> Path:
    """The release sdist for NAME==VER, downloaded once into the kvagent cache."""
    dest = cache_dir() / "sdists" / requirement.lower()
    found = (
        [p for p in dest.glob("*") if p.name.endswith((".tar.gz", ".zip", ".tar.bz2", ".tgz"))]
        if dest.is_dir()
        else []
    )
    if not found:
        log(f"downloading sdist {requirement}")
        tmp = Path(tempfile.mkdtemp(prefix=".dl-", dir=_mkdir(dest.parent)))
        try:
            _run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "-q",
                    "--no-deps",
                    "--no-binary",
                    requirement.split("==")[0],  # build requirements may be wheels (setuptools_scm's)
                    "-d",
                    str(tmp),
                    requirement,
                ],
                f"pip download {requirement}",
            )
            shutil.rmtree(dest, ignore_errors=True)
            os.replace(tmp, dest)  # atomic: a half download never looks cached
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        found = [p for p in dest.glob("*") if p.is_file()]
    if len(found) != 1:
        raise KvagentError(f"expected one sdist for {requirement} in {dest}, found {len(found)}")
    return found[0]


def _mkdir(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p


def unpack_archive(archive: Path, dest: Path) -> None:
    """Unpack an sdist into `dest`, dropping its single top-level folder (NAME-VER/)."""
    tmp = dest.with_name(dest.name + ".unpack")
    tmp.mkdir(parents=True)
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as z:
            for member in z.namelist():
                if member.startswith("/") or ".." in Path(member).parts:
                    raise KvagentError(f"{archive.name}: unsafe path {member!r} in archive")
            z.extractall(tmp)
    else:
        with tarfile.open(archive) as t:
            t.extractall(tmp, filter="data")  # refuses absolute paths, links out of the tree
    entries = list(tmp.iterdir())
    top = entries[0] if len(entries) == 1 and entries[0].is_dir() else tmp
    os.replace(top, dest)
    shutil.rmtree(tmp, ignore_errors=True)


def export_git(mirror: Path, commit: str, dest: Path) -> None:
    if not (mirror / ".git").exists() and not (mirror / "HEAD").exists():
        raise KvagentError(f"git source {mirror} is not a git repository")
    proc = subprocess.run(["git", "-C", str(mirror), "archive", "--format=tar", commit], capture_output=True)
    if proc.returncode != 0:
        msg = proc.stderr.decode(errors="replace").strip().splitlines()
        raise KvagentError(
            f"git archive {commit} from {mirror} failed: {msg[-1] if msg else 'unknown error'}"
        )
    dest.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as t:
        t.extractall(dest, filter="data")


def download_wheels(
    requirements: Sequence[str], dest: Path, python: str = "3.11", glibc: str = "2_36", log: Log = _quiet
) -> None:
    """Distributions for the image's Python and glibc (not the host's), dependencies included, into
    `dest`.

    Wheels for the image's platform first. Old pins can predate any wheel for that Python (MarkupSafe
    2.1.1 has no cp311 wheel): then resolve natively on a matching host, allowing sdists, which the
    image builds offline with its own setuptools.
    """
    log(f"downloading wheels: {' '.join(requirements)}")
    abi = "cp" + python.replace(".", "")
    cmd = [sys.executable, "-m", "pip", "download", "-q", "-d", str(dest), "--only-binary", ":all:"]
    cmd += [
        "--python-version",
        python,
        "--implementation",
        "cp",
        "--abi",
        abi,
        "--abi",
        "abi3",
        "--abi",
        "none",
    ]
    for plat in wheel_platforms(glibc):
        cmd += ["--platform", plat]
    try:
        _run(cmd + list(requirements), "pip download of the pinned wheels")
        return
    except KvagentError as strict_error:
        host_matches = (
            f"{sys.version_info.major}.{sys.version_info.minor}" == python
            and sys.platform == "linux"
            and platform.machine() == "x86_64"
        )
        if not host_matches:
            raise KvagentError(
                f"{strict_error} (no wheel for Python {python}; build on a Python {python} x86_64 Linux host to allow sdists)"
            ) from None
    log("no wheel for some pins; downloading sdists for them")
    native = [sys.executable, "-m", "pip", "download", "-q", "-d", str(dest), "--prefer-binary"]
    _run(native + list(requirements), "pip download of the pinned requirements")
