"""Docker images, in one place: looking one up, `docker build` with the network off, and the
registry-free base image (debootstrap a minimal Debian, then `docker import` it).

Air-gapped clusters have an apt mirror but no Docker registry, so the base image is made from the
mirror apt already uses. The rootfs tarball is cached under ~/.cache/kvagent so rebuilding after
`docker rmi` only re-imports it. Instance images (`kvagent.evals.images`) are built on top of it
with `build_image`.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def build_base_image(
    tag: str = DEFAULT_TAG, force: bool = False, suite: str = "bookworm", client: Any = None
) -> str:
    """Build (or reuse) a minimal Debian image with python3, git and patch; returns the tag.

    Skipped when `tag` already exists unless `force`; `force` also redoes debootstrap.
    """
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
    build."""
    if image_exists(tag, client):
        return tag
    if log is not None:
        log(f"building base image {tag} (debootstrap; a few minutes)")
    return build_base_image(tag=tag, force=False, client=client)
