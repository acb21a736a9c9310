"""What goes into an instance image's build context: the source (a release sdist, cached once, or an
export of a git mirror) and a wheelhouse of the pins for the image's Python, so the build itself
runs with the network off."""

from __future__ import annotations

import io
import os
import platform
import re
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
    """pip's --platform tags for an x86_64 image with that glibc (`2_31`: bullseye): every manylinux
    tag up to it, newest first, with the legacy aliases (pip does not widen a --platform tag, and
    most wheels of older releases are manylinux2014 = 2_17)."""
    major, minor = (int(x) for x in glibc.split("_"))
    tags = [f"manylinux_{major}_{m}_x86_64" for m in range(minor, 4, -1)]
    return (*tags, "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64")


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

    Wheels for the image's platform first; a pin with none for that Python (mpmath 1.1.0 ships only
    an sdist) takes its sdist, from any host. Where a dependency has none either (MarkupSafe 2.1.1
    has no cp311 wheel): resolve natively on a matching host, allowing sdists. The image builds
    sdists offline with its own setuptools.
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
        _wheels_else_sdists(cmd, list(requirements), dest, python, log)
        for _ in range(10):  # each round adds what the last one's wheels need on the image
            unmet = unmet_for_target(dest, python)
            if not unmet:
                return
            log(f"downloading what the image's Python needs beside: {' '.join(unmet)}")
            _run(cmd + unmet, "pip download of the image's own dependencies")
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


_NO_MATCH = re.compile(r"No matching distribution found for (\S+)")


def _wheels_else_sdists(cmd: list[str], requirements: list[str], dest: Path, python: str, log: Log) -> None:
    """`pip download` of the wheels for the image's Python (`cmd`); a pin of `requirements` that has
    no such wheel (sympy's `mpmath==1.1.0` ships only an sdist) gets its sdist instead, which the
    image builds offline with its own setuptools, and the rest is downloaded again. Any other
    failure is raised. An sdist's own dependencies are not resolved here: the image's install
    names any that is missing."""
    rest = list(requirements)
    while True:
        try:
            _run(cmd + rest, "pip download of the pinned wheels")
            return
        except KvagentError as e:
            m = _NO_MATCH.search(str(e))
            if not m or m.group(1) not in rest:
                raise
            pin = m.group(1)
        log(f"no wheel of {pin} for Python {python}; taking its sdist, built in the image offline")
        sdist = [sys.executable, "-m", "pip", "download", "-q", "-d", str(dest), "--no-binary", ":all:"]
        _run([*sdist, "--no-deps", pin], f"pip download of the sdist of {pin}")
        rest.remove(pin)
        if not rest:
            return


def _target_markers(python: str) -> dict[str, str]:
    """PEP 508 marker values of an image's CPython on x86_64 Linux."""
    return {
        "python_version": python,
        "python_full_version": f"{python}.0",
        "implementation_name": "cpython",
        "implementation_version": f"{python}.0",
        "platform_python_implementation": "CPython",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "os_name": "posix",
        "extra": "",
    }


def unmet_for_target(wheelhouse: Path, python: str) -> list[str]:
    """Requirements of the wheels in `wheelhouse` that hold on the image's Python but have no
    distribution there. pip evaluates markers for the host even with --python-version, so on a 3.11
    host it skips what 3.9 needs (pytest's `exceptiongroup; python_version < "3.11"`)."""
    from email.parser import BytesHeaderParser

    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename

    have, wheels = set(), []
    for f in wheelhouse.iterdir():
        try:
            if f.name.endswith(".whl"):
                have.add(parse_wheel_filename(f.name)[0])
                wheels.append(f)
            elif f.name.endswith((".tar.gz", ".zip")):
                have.add(parse_sdist_filename(f.name)[0])
        except ValueError:  # not a distribution (requirements.txt)
            continue
    env = _target_markers(python)
    unmet: dict[str, str] = {}
    for whl in sorted(wheels):
        with zipfile.ZipFile(whl) as z:
            meta = next((n for n in z.namelist() if n.endswith(".dist-info/METADATA")), None)
            headers = BytesHeaderParser().parsebytes(z.read(meta)) if meta else None
        for line in (headers.get_all("Requires-Dist") or []) if headers else []:
            try:
                req = Requirement(line)
            except InvalidRequirement:
                continue
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            name = canonicalize_name(req.name)
            if name not in have:
                unmet.setdefault(name, f"{req.name}{req.specifier}")
    return sorted(unmet.values())
