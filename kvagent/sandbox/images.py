"""Docker images, in one place: looking one up, `docker build` with the network off, and the
registry-free base images (debootstrap a minimal Debian, then `docker import` it), one per Debian
release, each with that release's CPython.

Air-gapped clusters have an apt mirror but no Docker registry, so a base image is made from the
mirror apt already uses. The rootfs tarball is cached under ~/.cache/kvagent so rebuilding after
`docker rmi` only re-imports it. Instance images (`kvagent.evals.images`) are built on top of the
release whose Python the instance needs, with `build_image`.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvagent.fileio import cache_dir
from kvagent.sandbox.errors import SandboxError

log = logging.getLogger(__name__)

PACKAGES = ("python3", "git", "patch")


@dataclass(frozen=True)
class Release:
    """A Debian release a base image can be made from: its python3 and its glibc (wheel tags)."""

    suite: str
    python: str
    glibc: str  # manylinux_<glibc>_x86_64 wheels run on it
    extra_packages: tuple[str, ...] = ()

    @property
    def tag(self) -> str:
        return base_tag(self.suite)


# The releases the Debian mirror serves (buster, with 3.7, is archived: gone from the mirrors).
# bullseye splits distutils out of the standard library; old setup.py files still import it.
RELEASES = {
    r.suite: r
    for r in (
        Release("bullseye", "3.9", "2_31", ("python3-distutils",)),
        Release("bookworm", "3.11", "2_36"),
        Release("trixie", "3.13", "2_41"),
    )
}
DEFAULT_SUITE = "bookworm"
DEFAULT_TAG = "kvagent/base:bookworm"


def base_tag(suite: str) -> str:
    return f"kvagent/base:{suite}"


def release_for_python(python: str) -> Release:
    """The release that ships CPython `python` (X.Y); a KvagentError naming those that exist."""
    for r in RELEASES.values():
        if r.python == python:
            return r
    have = ", ".join(f"{r.python} ({r.suite})" for r in RELEASES.values())
    raise SandboxError(f"no Debian release ships Python {python}; base images have {have}")


def _suite_of(tag: str, default: str) -> str:
    """`kvagent/base:SUITE` names its release; any other tag is built from `default`."""
    repo, _, version = tag.rpartition(":")
    return version if repo == "kvagent/base" and version in RELEASES else default


def apt_mirror(suite: str = "bookworm", apt_dir: str | Path = "/etc/apt") -> str | None:
    """The Debian mirror apt is configured with (deb822 `.sources` or one-line `.list` files);
    None when apt names none, and debootstrap then uses its own default."""
    apt_dir = Path(apt_dir)
    files = [apt_dir / "sources.list"]
    d = apt_dir / "sources.list.d"
    if d.is_dir():
        files += sorted(p for p in d.iterdir() if p.suffix in (".list", ".sources"))
    candidates: list[tuple[str, list[str]]] = []  # (uri, suites)
    for f in files:
        try:
            text = f.read_text(errors="replace")
        except OSError:
            continue
        if f.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                fields = {}
                for line in stanza.splitlines():
                    m = re.match(r"^([A-Za-z-]+):\s*(.*)$", line)
                    if m:
                        fields[m.group(1).lower()] = m.group(2).split()
                if "deb" in fields.get("types", []) and fields.get("uris"):
                    if fields.get("enabled", ["yes"])[0].lower() == "no":
                        continue
                    for uri in fields["uris"]:
                        candidates.append((uri, fields.get("suites", [])))
        else:
            for line in text.splitlines():
                m = re.match(r"^\s*deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)", line)
                if m:
                    candidates.append((m.group(1), [m.group(2)]))
    # Prefer the entry serving the plain suite (not -security/-updates, which live elsewhere).
    for uri, suites in candidates:
        if suite in suites and uri.startswith(("http://", "https://", "file:")):
            return uri.rstrip("/")
    for uri, _ in candidates:
        if "security" not in uri and uri.startswith(("http://", "https://", "file:")):
            return uri.rstrip("/")
    return None


def _client(client: Any = None) -> Any:
    from kvagent.sandbox.docker_backend import docker_client

    return client or docker_client()


def image_labels(tag: str, client: Any = None) -> dict[str, str] | None:
    """The labels of a local image, or None when there is no image `tag`."""
    import docker.errors

    try:
        image = _client(client).images.get(tag)
    except docker.errors.ImageNotFound:
        return None
    return getattr(image, "labels", None) or {}


def image_exists(tag: str, client: Any = None) -> bool:
    return image_labels(tag, client) is not None


def build_image(context: str | Path, tag: str, log_path: str | Path, client: Any = None) -> str:
    """`docker build` of a context directory with the network off, so nothing in the image can
    depend on a registry; the build's output goes to `log_path`. Returns the tag."""
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    error = None
    try:
        stream = _client(client).api.build(
            path=str(context), tag=tag, rm=True, forcerm=True, network_mode="none", decode=True
        )
        for chunk in stream:
            if "stream" in chunk:
                lines.append(chunk["stream"])
            if "error" in chunk:
                error = chunk["error"].strip()
                lines.append(chunk["error"])
    except SandboxError:
        raise
    except Exception as e:  # API errors (bad context, daemon gone)
        error = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    log_path.write_text("".join(lines))
    if error:
        tail = [ln.strip() for ln in "".join(lines).splitlines() if ln.strip()]
        detail = next((ln for ln in reversed(tail) if "rror" in ln and ln != error), "")
        raise SandboxError(
            f"building {tag} failed: {error}{' / ' + detail if detail else ''} (log: {log_path})"
        )
    return tag


def _rootfs_tarball(suite: str, force: bool) -> Path:
    extra = RELEASES[suite].extra_packages if suite in RELEASES else ()
    out = cache_dir() / f"rootfs-{suite}-minbase.tar"
    if out.exists() and not force:
        return out
    if shutil.which("debootstrap") is None:
        raise SandboxError("debootstrap is not installed; install it (`apt-get install debootstrap`)")
    if os.geteuid() != 0:
        raise SandboxError("building the base image runs debootstrap, which needs root; rerun as root")
    out.parent.mkdir(parents=True, exist_ok=True)
    mirror = apt_mirror(suite)
    with tempfile.TemporaryDirectory(prefix="kvagent-rootfs-") as tmp:
        root = Path(tmp) / "root"
        cmd = [
            "debootstrap",
            "--variant=minbase",
            "--include=" + ",".join((*PACKAGES, *extra)),
            suite,
            str(root),
            *([mirror] if mirror else []),
        ]
        log.info("debootstrap %s from %s (about a minute)", suite, mirror or "its default mirror")
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            tail = (p.stdout + p.stderr).strip().splitlines()[-3:]
            raise SandboxError(
                f"debootstrap {suite} from {mirror} failed ({' | '.join(tail)}); check the apt mirror is reachable"
            )
        # Drop the apt package cache: it is large and useless in the image.
        shutil.rmtree(root / "var/cache/apt/archives", ignore_errors=True)
        partial = out.with_suffix(".tar.partial")
        with open(partial, "wb") as f:
            subprocess.run(["tar", "--numeric-owner", "-C", str(root), "-c", "."], stdout=f, check=True)
        partial.replace(out)
    return out


def build_base_image(
    tag: str | None = None, force: bool = False, suite: str = DEFAULT_SUITE, client: Any = None
) -> str:
    """Build (or reuse) a minimal Debian `suite` image with python3, git and patch; returns the tag
    (default `kvagent/base:SUITE`).

    Skipped when `tag` already exists unless `force`; `force` also redoes debootstrap.
    """
    tag = tag or base_tag(suite)
    if not force and image_exists(tag, client):
        return tag
    tarball = _rootfs_tarball(suite, force)
    repo, _, version = tag.rpartition(":")
    if not repo or "/" in version:  # no explicit tag, e.g. "name" or "host:5000/name"
        repo, version = tag, "latest"
    _client(client).api.import_image_from_file(
        str(tarball),
        repository=repo,
        tag=version,
        changes=['CMD ["/bin/bash"]', "ENV LANG=C.UTF-8"],
    )
    if not image_exists(tag, client):
        raise SandboxError(f"docker import of {tarball} did not produce {tag}; delete the tarball and retry")
    return tag


def ensure_base_image(
    tag: str = DEFAULT_TAG, log: Callable[[str], None] | None = None, client: Any = None
) -> str:
    """The base image tag, built on first use (tests call this once per session); `log` hears of a
    build. `kvagent/base:SUITE` is built from that Debian release, any other tag from bookworm."""
    if image_exists(tag, client):
        return tag
    if log is not None:
        log(f"building base image {tag} (debootstrap; a few minutes)")
    return build_base_image(tag=tag, force=False, suite=_suite_of(tag, DEFAULT_SUITE), client=client)
