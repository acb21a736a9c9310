"""SWE-bench instances: loading from JSON / JSONL / parquet files or an HF dataset, selection, validation.

A record follows the SWE-bench schema (`instance_id`, `repo`, `base_commit`, `patch`, `test_patch`,
`problem_statement`, `FAIL_TO_PASS`, `PASS_TO_PASS`, ...). The released files store the two test lists
as JSON strings; they are parsed here so the rest of kvagent only ever sees lists.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvagent.errors import KvagentError
from kvagent.fileio import read_jsonl

# Fields every loaded instance must have: an agent run needs the first four, grading the last three.
REQUIRED_FIELDS: tuple[str, ...] = (
    "instance_id",
    "repo",
    "base_commit",
    "problem_statement",
    "test_patch",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
)

# Short names for the public HF releases, as the official harness accepts them.
HF_ALIASES = {
    "swe-bench": "SWE-bench/SWE-bench",
    "swebench": "SWE-bench/SWE-bench",
    "lite": "SWE-bench/SWE-bench_Lite",
    "swe-bench-lite": "SWE-bench/SWE-bench_Lite",
    "swe-bench_lite": "SWE-bench/SWE-bench_Lite",
    "swebench-lite": "SWE-bench/SWE-bench_Lite",
    "verified": "SWE-bench/SWE-bench_Verified",
    "swe-bench-verified": "SWE-bench/SWE-bench_Verified",
    "swe-bench_verified": "SWE-bench/SWE-bench_Verified",
}

FILE_SUFFIXES = (".json", ".jsonl", ".parquet")

_KNOWN = {
    "instance_id",
    "repo",
    "base_commit",
    "patch",
    "test_patch",
    "problem_statement",
    "hints_text",
    "created_at",
    "version",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
    "environment_setup_commit",
}


@dataclass
class Instance:
    """One SWE-bench task. Unknown record fields (e.g. `image`, `difficulty`) are kept in `extra`."""

    instance_id: str
    repo: str
    base_commit: str
    problem_statement: str
    test_patch: str
    FAIL_TO_PASS: list[str]
    PASS_TO_PASS: list[str]
    patch: str = ""
    version: str = ""
    hints_text: str = ""
    created_at: str = ""
    environment_setup_commit: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_record(
        cls, record: Mapping[str, Any], *, required: Sequence[str] = REQUIRED_FIELDS, where: str = ""
    ) -> Instance:
        """Validate one raw record; errors name the instance (or its position) and the field."""
        if not isinstance(record, Mapping):
            raise KvagentError(
                f"{where or 'dataset'}: expected an object per instance, got {type(record).__name__}"
            )
        iid = record.get("instance_id")
        who = f"instance {iid!r}" if iid else f"{where or 'record'} (no instance_id)"
        for name in required:
            value = record.get(name)
            if value is None or (isinstance(value, str) and name != "problem_statement" and not value):
                raise KvagentError(f"{who}: missing required field {name!r}{_at(where)}")
        if not isinstance(iid, str):
            raise KvagentError(f"{who}: field 'instance_id' must be a string{_at(where)}")
        values: dict[str, Any] = {}
        for name in ("FAIL_TO_PASS", "PASS_TO_PASS"):
            values[name] = _test_list(record.get(name), who, name, where)
        for name in _KNOWN - {"FAIL_TO_PASS", "PASS_TO_PASS"}:
            value = record.get(name)
            if value is None:
                value = ""
            if not isinstance(value, str):
                # Versions are sometimes stored as numbers (e.g. 3.0); keep their text.
                if name == "version" and isinstance(value, int | float):
                    value = str(value)
                else:
                    raise KvagentError(f"{who}: field {name!r} must be a string{_at(where)}")
            values[name] = value
        extra = {k: v for k, v in record.items() if k not in _KNOWN}
        return cls(**values, extra=extra)

    def to_record(self) -> dict[str, Any]:
        """The SWE-bench record (test lists as lists), extra fields included."""
        rec = {name: getattr(self, name) for name in sorted(_KNOWN)}
        rec.update(self.extra)
        return rec


def _at(where: str) -> str:
    return f" (in {where})" if where else ""


def _test_list(value: Any, who: str, name: str, where: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except json.JSONDecodeError as e:
            raise KvagentError(
                f"{who}: field {name!r} is not a JSON list of test ids ({e.msg}){_at(where)}"
            ) from None
    # parquet readers hand back numpy arrays or tuples for list columns
    if not isinstance(value, list | tuple) and hasattr(value, "tolist"):
        value = value.tolist()
    if not isinstance(value, list | tuple) or not all(isinstance(t, str) for t in value):
        raise KvagentError(f"{who}: field {name!r} must be a list of test id strings{_at(where)}")
    return list(value)


# ---------------------------------------------------------------------------------------------- loading


def load_records(source: str | Path, *, split: str = "test") -> list[dict[str, Any]]:
    """Raw records from a .json / .jsonl / .parquet file or an HF dataset name (with `split`)."""
    text = str(source)
    path = Path(text).expanduser()
    if path.is_dir():
        # A local HF-style folder: <dir>/<split>.parquet|jsonl|json
        for suffix in FILE_SUFFIXES:
            candidate = path / f"{split}{suffix}"
            if candidate.is_file():
                return load_records(candidate)
        raise KvagentError(f"dataset folder {path} has no {split}.jsonl, {split}.json or {split}.parquet")
    if path.is_file():
        suffix = path.suffix.lower()
        if suffix == ".jsonl":
            return _read_jsonl(path)
        if suffix == ".json":
            return _read_json(path)
        if suffix == ".parquet":
            return _read_parquet(path)
        raise KvagentError(f"dataset file {path}: unknown format {suffix!r}; use .json, .jsonl or .parquet")
    if text.lower().endswith(FILE_SUFFIXES) or text.startswith((".", "/", "~")):
        raise KvagentError(
            f"dataset file not found: {path}; pass an existing .json, .jsonl or .parquet file, or an HF "
            "dataset name (e.g. princeton-nlp/SWE-bench_Lite)"
        )
    return _read_hf(HF_ALIASES.get(text.lower(), text), split)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [rec for _, rec in read_jsonl(path)]


def _read_json(path: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise KvagentError(f"{path}:{e.lineno}: invalid JSON ({e.msg})") from None
    if isinstance(data, dict) and "instance_id" in data:
        return [data]
    if isinstance(data, dict):
        # {"instances": [...]} or {"<id>": {...}, ...}
        if isinstance(data.get("instances"), list):
            return data["instances"]
        if data and all(isinstance(v, dict) for v in data.values()):
            return [{"instance_id": k, **v} for k, v in data.items()]
    if isinstance(data, list):
        return data
    raise KvagentError(f"{path}: expected a JSON list of instance objects")


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        pq = None
    if pq is not None:
        return pq.read_table(path).to_pylist()
    try:
        import pandas as pd
    except ImportError:
        raise KvagentError(
            f"reading {path} needs pyarrow or pandas; install one (pip install pyarrow) or convert it to JSONL"
        ) from None
    return pd.read_parquet(path).to_dict("records")


def _read_hf(name: str, split: str) -> list[dict[str, Any]]:
    if not re.fullmatch(r"[\w.-]+(/[\w.-]+)?", name):
        raise KvagentError(f"dataset {name!r} is neither an existing file nor an HF dataset name")
    try:
        import datasets
    except ImportError:
        raise KvagentError(
            f"loading HF dataset {name!r} needs the `datasets` package (pip install 'kvagent[hf]'), "
            "or pass a local .json/.jsonl/.parquet file"
        ) from None
    try:
        ds = datasets.load_dataset(name, split=split)
    except Exception as e:  # network, auth, unknown split: all end the same way for the user
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise KvagentError(f"could not load HF dataset {name!r} split {split!r}: {first}") from None
    return [dict(r) for r in ds]


def load_instances(
    source: str | Path,
    *,
    split: str = "test",
    select: str | Sequence[str] | None = None,
    required: Sequence[str] = REQUIRED_FIELDS,
) -> list[Instance]:
    """Load, validate and (optionally) select instances. `select` is passed to `select_instances`."""
    records = load_records(source, split=split)
    where = str(source)
    instances = []
    seen: set[str] = set()
    for i, rec in enumerate(records):
        inst = Instance.from_record(rec, required=required, where=f"{where} record {i}")
        if inst.instance_id in seen:
            raise KvagentError(f"instance {inst.instance_id!r} appears twice in {where}")
        seen.add(inst.instance_id)
        instances.append(inst)
    if select is not None:
        instances = select_instances(instances, select)
    return instances


# -------------------------------------------------------------------------------------------- selection

_SLICE = re.compile(r"^\s*(-?\d*)\s*:\s*(-?\d*)\s*(?::\s*(-?\d+)\s*)?$")


def parse_selection(spec: str | Sequence[str] | None) -> dict[str, Any]:
    """Turn a user's selection into `select_instances` keyword arguments.

    Forms: comma-separated ids (`a__b-1,c__d-2`), a slice (`0:10`, `-5:`), a regex on the id
    (`re:flask`), a repository (`repo:pallets/flask`). A list is taken as ids.
    """
    if spec is None:
        return {}
    if not isinstance(spec, str):
        return {"ids": list(spec)}
    spec = spec.strip()
    if spec.startswith("re:"):
        return {"pattern": spec[3:]}
    if spec.startswith("repo:"):
        return {"repo": spec[5:]}
    if _SLICE.match(spec):
        return {"slice": spec}
    return {"ids": [s.strip() for s in spec.split(",") if s.strip()]}


def select_instances(
    instances: Sequence[Instance],
    spec: str | Sequence[str] | None = None,
    *,
    ids: Iterable[str] | None = None,
    slice: str | tuple[int | None, int | None] | None = None,  # noqa: A002 - mirrors the CLI word
    pattern: str | None = None,
    repo: str | Iterable[str] | None = None,
) -> list[Instance]:
    """Filter instances. All given criteria apply in turn (ids keep the order they were asked in)."""
    kwargs = parse_selection(spec)
    ids = kwargs.get("ids", ids)
    slice = kwargs.get("slice", slice)
    pattern = kwargs.get("pattern", pattern)
    repo = kwargs.get("repo", repo)
    out = list(instances)
    if repo is not None:
        repos = {repo} if isinstance(repo, str) else set(repo)
        known = {i.repo for i in out}
        if not repos & known:
            raise KvagentError(
                f"no instance from repository {', '.join(sorted(repos))}; known: {', '.join(sorted(known))}"
            )
        out = [i for i in out if i.repo in repos]
    if pattern is not None:
        try:
            rx = re.compile(pattern)
        except re.error as e:
            raise KvagentError(f"bad instance regex {pattern!r}: {e}") from None
        out = [i for i in out if rx.search(i.instance_id)]
    if slice is not None:
        out = out[_to_slice(slice)]
    if ids is not None:
        ids = list(ids)
        by_id = {i.instance_id: i for i in out}
        missing = [x for x in ids if x not in by_id]
        if missing:
            shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            raise KvagentError(
                f"instance id not in the dataset: {shown}; check --instances (ids a,b | slice 0:10 | re:REGEX)"
            )
        out = [by_id[x] for x in dict.fromkeys(ids)]
    return out


def _to_slice(value: str | tuple[int | None, int | None]) -> slice:
    if isinstance(value, tuple):
        return slice(*value)
    m = _SLICE.match(value)
    if not m:
        raise KvagentError(f"bad slice {value!r}; use START:STOP like 0:10")
    start, stop, step = (int(g) if g not in (None, "") else None for g in m.groups())
    if step == 0:
        raise KvagentError(f"bad slice {value!r}: step must not be 0")
    return slice(start, stop, step)
