"""`kvagent bench episodes build|check`: the bundled trajectories from their public sources
(bench/manifest.py), and an existing episode file checked against the manifest."""

from __future__ import annotations

from pathlib import Path

from kvagent.errors import ConfigError


def run_build(*, source: str | None, out: str | None, ids: list[str] | None, manifest: str | None) -> Path:
    from kvagent.bench import manifest as mf
    from kvagent.options import split_list

    m = mf.load_manifest(manifest or mf.MANIFEST)
    chosen = split_list(ids, "ids") if ids else None
    if chosen and out is None:
        raise ConfigError("ids: a part of the file is not the bundled file; pass --out FILE for it")
    read = mf.read_mirror(source) if source else mf.download()
    where = f"from {source}" if source else "from GitHub"
    n = len(mf.select(m, chosen))
    print(
        f"building {n} episode record(s) {where}, checking each sha256 against {Path(manifest or mf.MANIFEST).name}"
    )
    lines = mf.build_lines(m, read, chosen)
    if not chosen and (got := mf.sha256(mf.file_bytes(lines))) != m["sha256"]:
        raise ConfigError(
            f"build: the file's sha256 is {got}, the manifest expects {m['sha256']} although every record "
            "matched; the manifest's own digest is wrong, restore it (git log kvagent/bench)"
        )
    path = mf.write_file(lines, out or mf.default_file())
    used = sum(bool(e["designs"]) for e in mf.select(m, chosen))
    print(
        f"wrote {path}: {len(lines)} records ({used} chosen by a study design), every sha256 as the manifest says"
    )
    return path


def run_check(*, file: str | None, manifest: str | None) -> int:
    from kvagent.bench import manifest as mf

    m = mf.load_manifest(manifest or mf.MANIFEST)
    path = Path(file) if file else mf.default_file()
    n = mf.check_file(m, path)
    print(f"{path}: {n} records, every sha256 as the manifest says")
    return n
