"""The study's episodes from a public clone (issue #57): the shipped manifest names every episode
the designs use, `kvagent bench episodes build` rebuilds a study episode's record from a local
mirror (tests/bench/data/episode_mirror) with its sha256 checked, and refuses a changed source, a
changed record or a changed file in one line. No test reads ../shared."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvagent.bench import manifest as mf
from kvagent.bench.converters import CONVERTERS, stats
from kvagent.bench.sources import load_episodes
from kvagent.cli.app import app
from kvagent.errors import ConfigError, KvagentError

ROOT = Path(__file__).resolve().parents[2]
MIRROR = Path(__file__).with_name("data") / "episode_mirror"
EPISODE = "swemaster-sft-scriptdemo-1"  # both designs choose it; its source is in MIRROR


def _run(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def _entry(manifest, rid=EPISODE):
    return next(e for e in manifest["episodes"] if e["id"] == rid)


def _one_line(r) -> str:
    assert r.exit_code == 2, r.output
    lines = [x for x in r.output.splitlines() if x.startswith("kvagent: error:")]
    assert len(lines) == 1, r.output
    return lines[0]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KVAGENT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_manifest_names_every_episode_both_designs_use():
    manifest = mf.load_manifest()
    ids = [e["id"] for e in manifest["episodes"]]
    assert len(ids) == len(set(ids)) == manifest["records"]
    for claim in ("random", "nexus"):
        design = json.loads((ROOT / "docs/study" / claim / "design.json").read_text())
        for rid in design["chosen"]:
            assert claim in _entry(manifest, rid)["designs"], rid
        # the not-chosen ones are read by the eligibility rule too, so they are in the file
        assert {n["name"] for n in design["not_chosen"]} <= set(ids)
        assert {e["id"] for e in manifest["episodes"] if claim in e["designs"]} == set(design["chosen"])
    for e in manifest["episodes"]:
        assert set(e["source"]) >= {"repo", "commit", "path"} and len(e["source"]["commit"]) == 40
        assert e["converter"] in CONVERTERS and len(e["sha256"]) == len(e["source_sha256"]) == 64


def test_a_study_episode_builds_from_the_mirror_with_its_sha256(tmp_path, cache):
    out = tmp_path / "one.jsonl"
    r = _run("bench", "episodes", "build", "--from", MIRROR, "--ids", EPISODE, "--out", out)
    assert r.exit_code == 0, r.output
    assert "every sha256 as the manifest says" in r.output
    line = out.read_bytes()
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert mf.sha256(line[:-1]) == _entry(mf.load_manifest())["sha256"]
    record = json.loads(line)
    assert record["id"] == EPISODE and record["stats"] == stats(record["messages"])
    (ep,) = load_episodes([f"{out}:plant=0"])
    assert ep.name == EPISODE and len(ep.messages) == record["stats"]["n_messages"] == 154
    assert not (cache / "episodes").exists()  # a part is never written where `bundled` reads


def test_a_changed_source_is_refused_in_one_line(tmp_path, cache):
    mirror = tmp_path / "mirror"
    shutil.copytree(MIRROR, mirror)
    gz = next(mirror.rglob("*.jsonl.gz"))
    data = gzip.decompress(gz.read_bytes()).replace(b"Perfect", b"Perfekt", 1)
    gz.unlink()
    gz.with_suffix("").write_bytes(data)  # a plain file beside where the .gz was
    out = tmp_path / "one.jsonl"
    line = _one_line(_run("bench", "episodes", "build", "--from", mirror, "--ids", EPISODE, "--out", out))
    entry = _entry(mf.load_manifest())
    assert f"episode {EPISODE}" in line and entry["source_sha256"] in line and mf.sha256(data) in line
    assert f"at commit {entry['source']['commit']}" in line
    assert not out.exists()


def test_a_record_whose_sha256_differs_is_refused_and_nothing_is_written(tmp_path, cache):
    manifest = mf.load_manifest()
    entry = _entry(manifest)
    want = entry["sha256"]
    entry["sha256"] = "0" * 64  # as if the converter had changed what it makes
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(manifest))
    out = tmp_path / "one.jsonl"
    r = _run(
        "bench", "episodes", "build", "--from", MIRROR, "--ids", EPISODE, "--out", out, "--manifest", path
    )
    line = _one_line(r)
    assert f"episode {EPISODE}" in line and "0" * 64 in line and want in line
    assert "converter 'chat-input' changed" in line
    assert not out.exists()


def _one_episode_manifest(tmp_path) -> Path:
    """The shipped manifest cut to the mirror's episode, so a whole file builds from the fixture."""
    manifest = mf.load_manifest()
    entry = _entry(manifest)
    manifest["episodes"], manifest["records"] = [entry], 1
    data = gzip.decompress(next(MIRROR.rglob("*.gz")).read_bytes())
    manifest["sha256"] = mf.sha256(mf.file_bytes([mf.record_line(mf.make_record(entry, data))]))
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(manifest))
    return path


def test_check_refuses_a_file_that_differs_from_the_manifest(tmp_path, cache):
    manifest = _one_episode_manifest(tmp_path)
    out = tmp_path / "eps.jsonl"
    r = _run("bench", "episodes", "build", "--from", MIRROR, "--out", out, "--manifest", manifest)
    assert r.exit_code == 0, r.output
    r = _run("bench", "episodes", "check", out, "--manifest", manifest)
    assert r.exit_code == 0 and "1 records, every sha256" in r.output, r.output
    out.write_bytes(out.read_bytes().replace(b"Perfect", b"Perfekt", 1))
    line = _one_line(_run("bench", "episodes", "check", out, "--manifest", manifest))
    assert f"{out}:1 (episode {EPISODE})" in line and "kvagent bench episodes build" in line


def test_bundled_is_the_built_file_or_one_line_saying_how_to_build_it(tmp_path, cache, monkeypatch):
    with pytest.raises(ConfigError, match="not built yet .*run `kvagent bench episodes build`"):
        load_episodes(["bundled"])
    line = _one_line(_run("bench", "study", "--claim", "random", "--out", tmp_path / "study"))
    assert "kvagent bench episodes build" in line
    # built (here from a one-episode manifest standing in for the shipped one): read, digest checked
    manifest = _one_episode_manifest(tmp_path)
    assert _run("bench", "episodes", "build", "--from", MIRROR, "--manifest", manifest).exit_code == 0
    monkeypatch.setattr(mf, "MANIFEST", manifest)
    (ep,) = load_episodes(["bundled:plant=0"])
    assert ep.name == EPISODE
    built = cache / "episodes" / "trajectories_dev.jsonl"
    built.write_bytes(built.read_bytes() + b"\n{}\n")
    with pytest.raises(ConfigError, match="rebuild it with `kvagent bench episodes build`"):
        load_episodes(["bundled"])


def test_a_missing_source_names_the_clone_to_make(tmp_path, cache):
    (tmp_path / "empty").mkdir()
    with pytest.raises(KvagentError, match="clone github.com/RUCAIBox/SWE-Master there at that commit"):
        mf.build_lines(mf.load_manifest(), mf.read_mirror(tmp_path / "empty"), [EPISODE])
    line = _one_line(_run("bench", "episodes", "build", "--ids", "nope", "--out", tmp_path / "x.jsonl"))
    assert "nope not in the manifest" in line


def test_a_clean_checkout_without_shared_reproduces_a_study_episode(tmp_path):
    """The acceptance of issue #57: the package's and the fixture's tracked files alone (no
    ../shared beside them), in a fresh process, rebuild the study episode through the manifest."""
    try:
        tracked = subprocess.run(
            ["git", "-C", str(ROOT), "ls-files", "kvagent", "tests/bench/data"],
            capture_output=True, text=True, check=True,
        ).stdout.split()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    clone = tmp_path / "clone"
    for rel in tracked:
        if (ROOT / rel).is_file():
            (clone / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, clone / rel)
    assert not (clone.parent / "shared").exists()
    env = {**os.environ, "PYTHONPATH": str(clone), "KVAGENT_CACHE": str(tmp_path / "cache")}
    out = tmp_path / "episode.jsonl"
    build = ["bench", "episodes", "build", "--from", "tests/bench/data/episode_mirror", "--ids", EPISODE]
    r = subprocess.run(
        [sys.executable, "-m", "kvagent", *build, "--out", str(out)],
        cwd=clone, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert f"wrote {out}: 1 records" in r.stdout
    assert mf.sha256(out.read_bytes()[:-1]) == _entry(mf.load_manifest())["sha256"]


def _traj(obj) -> bytes:
    return json.dumps(obj).encode()


CALL = {
    "index": 1,
    "id": "c1",
    "type": "function",
    "function": {"name": "bash", "arguments": '{"command": "ls"}'},
}
OPENAI_CALL = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}


def test_each_converter_keeps_the_texts_and_drops_what_its_docstring_says():
    """The formats the fixture mirror does not hold, on hand-made sources of their shape."""
    h0 = [{"role": "system", "content": "S", "agent": "primary"}, {"role": "user", "content": "demo", "is_demo": True},
          {"role": "assistant", "content": "A", "thought": "A", "action": "ls\n"}, {"role": "user", "content": "O"}]  # fmt: skip
    assert CONVERTERS["sweagent-0.x"](_traj({"history": h0}), None) == [
        {"role": "system", "content": "S"}, {"role": "user", "content": "demo"},
        {"role": "assistant", "content": "A"}, {"role": "user", "content": "O"},
    ]  # fmt: skip
    h1 = [{"role": "user", "content": [{"type": "text", "text": "T"}]},
          {"role": "assistant", "content": "A", "tool_calls": [CALL]},
          {"role": "tool", "content": [{"type": "text", "text": "O"}], "tool_call_ids": ["c1"]}]  # fmt: skip
    assert CONVERTERS["sweagent-1.x"](_traj({"history": h1}), None) == [
        {"role": "user", "content": "T"}, {"role": "assistant", "content": "A", "tool_calls": [OPENAI_CALL]},
        {"role": "tool", "content": "O", "tool_call_id": "c1"},
    ]  # fmt: skip
    mini = [{"role": "assistant", "content": None, "tool_calls": [CALL], "extra": {}},
            {"role": "tool", "content": "O", "tool_call_id": "c1"}, {"role": "exit", "content": "patch"}]  # fmt: skip
    assert CONVERTERS["mini-swe-agent"](_traj({"messages": mini}), None) == [
        {"role": "assistant", "content": "", "tool_calls": [OPENAI_CALL]},
        {"role": "tool", "content": "O", "tool_call_id": "c1"},
    ]  # fmt: skip
    meta = {
        "tool_call_id": "c1",
        "model_response": {"id": "r1", "choices": [{"message": {"content": "A", "tool_calls": [CALL]}}]},
    }
    events = [{"action": "system", "args": {"content": "S"}}, {"action": "message", "args": {"content": "T"}},
              {"action": "recall", "args": {}}, {"observation": "recall", "content": "ctx"},
              {"action": "run", "tool_call_metadata": meta}, {"observation": "run", "content": "O", "tool_call_metadata": meta},
              {"observation": "error", "content": "E"}]  # fmt: skip
    rows = b"\n".join([b"{}", _traj({"history": events})])
    assert CONVERTERS["openhands"](rows, 2) == [
        {"role": "system", "content": "S"}, {"role": "user", "content": "T"},
        {"role": "assistant", "content": "A", "tool_calls": [OPENAI_CALL]},
        {"role": "tool", "content": "O", "tool_call_id": "c1"}, {"role": "tool", "content": "E"},
    ]  # fmt: skip
    with pytest.raises(KvagentError, match="no line 3"):
        CONVERTERS["openhands"](rows, 3)
    r2e = {"agent_args": {"system_prompt": "S", "instance_prompt": "in {working_dir}: {problem_statement} {x}"},
           "problem_statement": "bug", "trajectory_steps": [{"thought": "<think>t</think>", "action": "<function=f>", "observation": "O"}]}  # fmt: skip
    assert CONVERTERS["r2egym-steps"](_traj(r2e), 1) == [
        {"role": "system", "content": "S"}, {"role": "user", "content": "in /testbed: bug {x}"},
        {"role": "assistant", "content": "<think>t</think>\n\n<function=f>"}, {"role": "tool", "content": "O"},
    ]  # fmt: skip
