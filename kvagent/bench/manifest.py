"""The bundled trajectories, rebuilt from their public sources: the manifest and the build.

`trajectories_dev.manifest.json` (beside this module) lists, in file order, every record of the
episode file the study's designs read (`kvagent bench study`'s default, `--episodes bundled`):
its source (repository, commit, path, line of a JSONL file) and the source file's sha256, the
converter that makes its messages (`bench/converters.py`), the fields a converter cannot read (who
ran it, the notes on what was dropped), which designs choose it, and the sha256 of the record's
line. `build_lines` reads each source through a `read(source) -> bytes` the caller picks (a local
mirror, `read_mirror`, or GitHub, `download`), converts it and checks both digests, refusing the
first mismatch in one line; `write_file` then writes the file atomically. `bundled_file` is where
the build puts it (the kvagent cache), checked against the manifest's digest of the whole file.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvagent.bench.converters import CONVERTERS, stats
from kvagent.errors import ConfigError, KvagentError
from kvagent.fileio import atomic_write_bytes, cache_dir

MANIFEST = Path(__file__).with_name("trajectories_dev.manifest.json")
FORMAT = "kvagent.episode-manifest/1"
BUILD_HINT = "kvagent bench episodes build"
RAW_URL = "https://raw.githubusercontent.com/{repo}/{commit}/{path}"

Reader = Callable[[dict[str, Any]], bytes]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def load_manifest(path: str | Path | None = None) -> dict[str, Any]:
    path = Path(path or MANIFEST)
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"manifest: cannot read {path} ({e}); pass --manifest FILE") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ConfigError(f"manifest: {path} is not a {FORMAT} file; pass the episode manifest")
    for e in manifest["episodes"]:
        if e["converter"] not in CONVERTERS:
            raise ConfigError(
                f"manifest: episode {e['id']} names converter {e['converter']!r}; "
                f"known: {', '.join(CONVERTERS)}"
            )
    return manifest


def where(source: dict[str, Any]) -> str:
    line = f" line {source['line']}" if source.get("line") else ""
    return f"{source['repo']}@{source['commit'][:12]}:{source['path']}{line}"


# ----------------------------------------------------------------------- reading the sources
def read_mirror(root: str | Path) -> Reader:
    """Sources from a local directory: ROOT/OWNER/NAME/PATH (a checkout of the repository at the
    manifest's commit, or just the files; PATH.gz is read too), else ROOT/OWNER/NAME as a git
    repository (or a bare mirror) holding the commit."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise ConfigError(f"from: {root} is not a directory; pass --from DIR holding OWNER/NAME/PATH")

    def read(source: dict[str, Any]) -> bytes:
        repo_dir = root / source["repo"]
        file = repo_dir / source["path"]
        if file.is_file():
            return file.read_bytes()
        gz = file.with_name(file.name + ".gz")
        if gz.is_file():
            return gzip.decompress(gz.read_bytes())
        if repo_dir.is_dir():
            git = subprocess.run(
                ["git", "-C", str(repo_dir), "cat-file", "blob", f"{source['commit']}:{source['path']}"],
                capture_output=True,
            )
            if git.returncode == 0:
                return git.stdout
        raise KvagentError(
            f"from: no {source['path']} under {repo_dir} (neither the file nor a git repository with "
            f"commit {source['commit'][:12]}); clone github.com/{source['repo']} there at that commit"
        )

    return read


def download(timeout: float = 120.0) -> Reader:
    """Sources from GitHub at the manifest's commit (raw.githubusercontent.com)."""

    def read(source: dict[str, Any]) -> bytes:
        url = RAW_URL.format(**source)
        try:
            with urllib.request.urlopen(url, timeout=timeout) as r:
                return r.read()
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise KvagentError(
                f"download: cannot fetch {url} ({reason}); without the network, clone "
                f"github.com/{source['repo']} at {source['commit'][:12]} under DIR/{source['repo']} and pass --from DIR"
            ) from None

    return read


# ----------------------------------------------------------------------- the build
def make_record(entry: dict[str, Any], data: bytes) -> dict[str, Any]:
    """The record one manifest entry makes from its source file's bytes."""
    source = entry["source"]
    messages = CONVERTERS[entry["converter"]](data, source.get("line"))
    return {
        "id": entry["id"],
        "source": source,
        **entry["fields"],
        "messages": messages,
        "stats": stats(messages),
    }


def record_line(record: dict[str, Any]) -> bytes:
    """A record's line as the file holds it (its sha256 is the manifest's), without the newline:
    json.dumps' defaults, so ASCII with non-ASCII characters escaped."""
    return json.dumps(record).encode("ascii")


def select(manifest: dict[str, Any], ids: list[str] | None) -> list[dict[str, Any]]:
    entries = manifest["episodes"]
    if not ids:
        return entries
    known = {e["id"] for e in entries}
    unknown = [i for i in ids if i not in known]
    if unknown:
        raise ConfigError(
            f"ids: {', '.join(unknown)} not in the manifest; its ids are in {MANIFEST.name}'s episodes"
        )
    return [e for e in entries if e["id"] in ids]


def build_lines(
    manifest: dict[str, Any],
    read: Reader,
    ids: list[str] | None = None,
    on_record: Callable[[dict[str, Any]], None] | None = None,
) -> list[bytes]:
    """Every selected record's line, built from its source and checked: the source file's sha256,
    then the record's. A mismatch is one line naming the record, the expected and the got digest
    and the fix; nothing is returned then (the caller writes nothing)."""
    sources: dict[tuple[str, str, str], bytes] = {}
    lines = []
    for entry in select(manifest, ids):
        src = entry["source"]
        key = (src["repo"], src["commit"], src["path"])
        if key not in sources:
            sources[key] = read(src)
        data = sources[key]
        got = sha256(data)
        if got != entry["source_sha256"]:
            raise KvagentError(
                f"episode {entry['id']}: source {where(src)} has sha256 {got}, the manifest expects "
                f"{entry['source_sha256']}; fetch that file at commit {src['commit']} (not another version)"
            )
        line = record_line(make_record(entry, data))
        got = sha256(line)
        if got != entry["sha256"]:
            raise KvagentError(
                f"episode {entry['id']}: built record has sha256 {got}, the manifest expects {entry['sha256']}; "
                f"the source is right, so converter {entry['converter']!r} changed: restore it (git log "
                "kvagent/bench/converters.py)"
            )
        lines.append(line)
        if on_record is not None:
            on_record(entry)
    return lines


def file_bytes(lines: list[bytes]) -> bytes:
    return b"".join(line + b"\n" for line in lines)


def write_file(lines: list[bytes], out: str | Path) -> Path:
    return atomic_write_bytes(out, file_bytes(lines))


def check_file(manifest: dict[str, Any], path: str | Path) -> int:
    """An existing episode file against the manifest: every record, in order, by its line's sha256.
    Returns the number of records checked; the first difference is one line."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"check: {path} does not exist; build it with `{BUILD_HINT}`")
    rows = [r for r in path.read_bytes().split(b"\n") if r.strip()]
    entries = manifest["episodes"]
    if len(rows) != len(entries):
        raise KvagentError(
            f"check: {path} has {len(rows)} records, the manifest {len(entries)}; rebuild it with `{BUILD_HINT}`"
        )
    for n, (row, entry) in enumerate(zip(rows, entries, strict=True), 1):
        got = sha256(row.rstrip(b"\r"))
        if got != entry["sha256"]:
            raise KvagentError(
                f"check: {path}:{n} (episode {entry['id']}) has sha256 {got}, the manifest expects "
                f"{entry['sha256']}; rebuild it with `{BUILD_HINT}`"
            )
    return len(rows)


# ----------------------------------------------------------------------- where the file lives
def default_file() -> Path:
    """Where `kvagent bench episodes build` writes the episode file by default."""
    return cache_dir() / "episodes" / "trajectories_dev.jsonl"


def bundled_file(manifest_path: str | Path | None = None) -> Path:
    """The built episode file (`--episodes bundled`), its digest checked against the manifest's."""
    path = default_file()
    if not path.is_file():
        raise ConfigError(
            f"episodes: the bundled trajectories are not built yet ({path} is missing); run `{BUILD_HINT}` "
            "(downloads them from GitHub; --from DIR reads a local mirror) or pass --episodes FILE.jsonl"
        )
    manifest = load_manifest(manifest_path or MANIFEST)
    got = sha256(path.read_bytes())
    if got != manifest["sha256"]:
        raise ConfigError(
            f"episodes: {path} has sha256 {got}, the manifest expects {manifest['sha256']}; "
            f"rebuild it with `{BUILD_HINT}`"
        )
    return path
