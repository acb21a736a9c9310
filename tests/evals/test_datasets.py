"""Instance loading, selection and validation on small fixture files."""

from __future__ import annotations

import json
import sys
import types

import pytest

from kvagent.errors import KvagentError
from kvagent.evals.datasets import (
    Instance,
    load_instances,
    load_records,
    parse_selection,
    select_instances,
)


def record(iid: str, repo: str = "owner/proj", **over) -> dict:
    rec = {
        "instance_id": iid,
        "repo": repo,
        "base_commit": "abc123",
        "patch": "diff --git a/x.py b/x.py\n",
        "test_patch": "diff --git a/tests/test_x.py b/tests/test_x.py\n",
        "problem_statement": f"issue of {iid}",
        "hints_text": "",
        "created_at": "2023-01-01T00:00:00Z",
        "version": "1.0",
        # As in the released files: the test lists are JSON strings.
        "FAIL_TO_PASS": json.dumps([f"tests/test_x.py::test_{iid}"]),
        "PASS_TO_PASS": json.dumps(["tests/test_x.py::test_ok", "tests/test_x.py::test_b[a b]"]),
        "environment_setup_commit": "def456",
    }
    rec.update(over)
    return rec


RECORDS = [
    record("pallets__flask-1", "pallets/flask"),
    record("pallets__flask-2", "pallets/flask"),
    record("pydicom__pydicom-3", "pydicom/pydicom", difficulty="<15 min fix"),
    record("owner__proj-4"),
    record("owner__proj-5", version=3.0),
]


@pytest.fixture
def jsonl(tmp_path):
    path = tmp_path / "set.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS) + "\n")
    return path


def test_jsonl_parses_test_lists_and_keeps_extra_fields(jsonl):
    insts = load_instances(jsonl)
    assert [i.instance_id for i in insts] == [r["instance_id"] for r in RECORDS]
    first = insts[0]
    assert isinstance(first, Instance)
    assert first.FAIL_TO_PASS == ["tests/test_x.py::test_pallets__flask-1"]
    assert first.PASS_TO_PASS == ["tests/test_x.py::test_ok", "tests/test_x.py::test_b[a b]"]
    assert insts[2].extra == {"difficulty": "<15 min fix"}
    assert insts[4].version == "3.0"  # numeric versions keep their text
    assert first.to_record()["FAIL_TO_PASS"] == first.FAIL_TO_PASS


def test_json_list_object_and_keyed_object(tmp_path):
    as_list = tmp_path / "a.json"
    as_list.write_text(json.dumps(RECORDS[:2]))
    assert [i.instance_id for i in load_instances(as_list)] == ["pallets__flask-1", "pallets__flask-2"]

    keyed = tmp_path / "b.json"
    keyed.write_text(
        json.dumps(
            {r["instance_id"]: {k: v for k, v in r.items() if k != "instance_id"} for r in RECORDS[:3]}
        )
    )
    assert len(load_instances(keyed)) == 3

    lists = tmp_path / "c.json"
    lists.write_text(json.dumps([record("x__y-1", FAIL_TO_PASS=["t::a"], PASS_TO_PASS=[])]))
    inst = load_instances(lists)[0]
    assert inst.FAIL_TO_PASS == ["t::a"] and inst.PASS_TO_PASS == []


def test_parquet_roundtrip(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "test.parquet"
    pq.write_table(pa.Table.from_pylist(RECORDS[:4]), path)
    insts = load_instances(path)
    assert [i.instance_id for i in insts] == [r["instance_id"] for r in RECORDS[:4]]
    assert insts[0].PASS_TO_PASS[1] == "tests/test_x.py::test_b[a b]"
    # A local HF-style folder resolves <dir>/<split>.parquet.
    assert len(load_instances(tmp_path, split="test")) == 4


def test_parquet_without_readers_is_a_clear_error(tmp_path, monkeypatch):
    path = tmp_path / "x.parquet"
    path.write_bytes(b"PAR1")
    for mod in ("pyarrow", "pyarrow.parquet", "pandas"):
        monkeypatch.setitem(sys.modules, mod, None)  # makes `import mod` raise ImportError
    with pytest.raises(KvagentError, match="pyarrow or pandas"):
        load_records(path)


def test_hf_name_without_datasets_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(KvagentError, match=r"needs the `datasets` package") as e:
        load_records("SWE-bench/SWE-bench_Lite")
    assert "\n" not in str(e.value)


def test_hf_failure_is_one_line_and_aliases_resolve(monkeypatch):
    calls = []

    def load_dataset(name, split):
        calls.append((name, split))
        if name == "SWE-bench/SWE-bench_Lite":
            return [RECORDS[0]]
        raise ConnectionError("Couldn't reach the Hub\nTraceback details")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    assert [i.instance_id for i in load_instances("lite", split="dev")] == ["pallets__flask-1"]
    assert calls[0] == ("SWE-bench/SWE-bench_Lite", "dev")
    with pytest.raises(KvagentError) as e:
        load_records("someone/unreachable")
    assert "someone/unreachable" in str(e.value) and "Couldn't reach the Hub" in str(e.value)
    assert "\n" not in str(e.value)


def test_missing_file_and_bad_json(tmp_path):
    with pytest.raises(KvagentError, match="not found"):
        load_records(tmp_path / "nope.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(RECORDS[0]) + "\n{not json\n")
    with pytest.raises(KvagentError, match=r"bad.jsonl:2: invalid JSON"):
        load_records(bad)


@pytest.mark.parametrize("field", ["repo", "base_commit", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS"])
def test_missing_field_names_instance_and_field(tmp_path, field):
    rec = record("owner__proj-9")
    del rec[field]
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps(RECORDS[0]) + "\n" + json.dumps(rec) + "\n")
    with pytest.raises(KvagentError) as e:
        load_instances(path)
    assert "owner__proj-9" in str(e.value) and repr(field) in str(e.value)


def test_missing_instance_id_names_record_position(tmp_path):
    rec = record("x")
    del rec["instance_id"]
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps(RECORDS[0]) + "\n" + json.dumps(rec) + "\n")
    with pytest.raises(KvagentError, match=r"record 1.*'instance_id'"):
        load_instances(path)


def test_bad_test_list_and_duplicates(tmp_path):
    path = tmp_path / "b.jsonl"
    path.write_text(json.dumps(record("a__b-1", FAIL_TO_PASS="[not json")) + "\n")
    with pytest.raises(KvagentError, match=r"a__b-1.*FAIL_TO_PASS.*JSON"):
        load_instances(path)
    path.write_text(json.dumps(record("a__b-1", PASS_TO_PASS=[1, 2])) + "\n")
    with pytest.raises(KvagentError, match=r"a__b-1.*PASS_TO_PASS"):
        load_instances(path)
    path.write_text((json.dumps(record("a__b-1")) + "\n") * 2)
    with pytest.raises(KvagentError, match="twice"):
        load_instances(path)


def test_selection_forms(jsonl):
    insts = load_instances(jsonl)
    ids = lambda xs: [i.instance_id for i in xs]  # noqa: E731
    assert ids(select_instances(insts, "owner__proj-4,pallets__flask-1")) == [
        "owner__proj-4",
        "pallets__flask-1",
    ]
    assert ids(select_instances(insts, ["pydicom__pydicom-3"])) == ["pydicom__pydicom-3"]
    assert ids(select_instances(insts, "1:3")) == ["pallets__flask-2", "pydicom__pydicom-3"]
    assert ids(select_instances(insts, "-2:")) == ["owner__proj-4", "owner__proj-5"]
    assert ids(select_instances(insts, ":1")) == ["pallets__flask-1"]
    assert ids(select_instances(insts, "::2")) == ["pallets__flask-1", "pydicom__pydicom-3", "owner__proj-5"]
    assert ids(select_instances(insts, "re:flask-[12]$")) == ["pallets__flask-1", "pallets__flask-2"]
    assert ids(select_instances(insts, "repo:pydicom/pydicom")) == ["pydicom__pydicom-3"]
    # Keyword criteria combine: repo then slice.
    assert ids(select_instances(insts, repo="pallets/flask", slice="1:")) == ["pallets__flask-2"]
    assert ids(select_instances(insts, pattern="proj", ids=["owner__proj-5"])) == ["owner__proj-5"]
    assert ids(load_instances(jsonl, select="re:pydicom")) == ["pydicom__pydicom-3"]


def test_selection_errors(jsonl):
    insts = load_instances(jsonl)
    with pytest.raises(KvagentError, match="not in the dataset: nope__x-1"):
        select_instances(insts, "pallets__flask-1,nope__x-1")
    with pytest.raises(KvagentError, match="bad instance regex"):
        select_instances(insts, "re:(")
    with pytest.raises(KvagentError, match="no instance from repository"):
        select_instances(insts, "repo:psf/requests")
    with pytest.raises(KvagentError, match="step must not be 0"):
        select_instances(insts, "0:4:0")


def test_parse_selection():
    assert parse_selection("0:10") == {"slice": "0:10"}
    assert parse_selection("a,b") == {"ids": ["a", "b"]}
    assert parse_selection("re:x.*") == {"pattern": "x.*"}
    assert parse_selection(None) == {}
