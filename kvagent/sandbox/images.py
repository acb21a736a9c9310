"""Build the registry-free test/base image: debootstrap a minimal Debian, then `docker import` it.

Air-gapped clusters have an apt mirror but no Docker registry, so the base image is made from the
mirror apt already uses. The rootfs tarball is cached under ~/.cache/kvagent so rebuilding after
`docker rmi` only re-imports it.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from kvagent.fileio import cache_dir
from kvagent.sandbox.errors import SandboxError

log = logging.getLogger(__name__)

DEFAULT_TAG = "kvagent/base:bookworm"
PACKAGES = ("python3", "git", "patch")


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


def _client():
    from kvagent.sandbox.docker_backend import docker_client

    return docker_client()


def image_exists(tag: str) -> bool:
    import docker.errors

    try:
        _client().images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def _rootfs_tarball(suite: str, force: bool) -> Path:
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
            "--include=" + ",".join(PACKAGES),
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


def build_base_image(tag: str = DEFAULT_TAG, force: bool = False, suite: str = "bookworm") -> str:
    """Build (or reuse) a minimal Debian image with python3, git and patch; returns the tag.

    Skipped when `tag` already exists unless `force`; `force` also redoes debootstrap.
    """
    if not force and image_exists(tag):
        return tag
    tarball = _rootfs_tarball(suite, force)
    repo, _, version = tag.rpartition(":")
    if not repo or "/" in version:  # no explicit tag, e.g. "name" or "host:5000/name"
        repo, version = tag, "latest"
    _client().api.import_image_from_file(
        str(tarball),
        repository=repo,
        tag=version,
        changes=['CMD ["/bin/bash"]', "ENV LANG=C.UTF-8"],
    )
    if not image_exists(tag):
        raise SandboxError(f"docker import of {tarball} did not produce {tag}; delete the tarball and retry")
    return tag


def ensure_base_image(tag: str = DEFAULT_TAG) -> str:
    """The base image tag, built on first use (tests call this once per session)."""
    return build_base_image(tag=tag, force=False)
