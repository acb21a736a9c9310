"""Several processes on one fidelity/study out dir: each run is done once, no record is lost, and a
dead process's claim does not block its run. Two `SharedResults` in one process lock and claim as
two processes would (flock locks open files, and a claim names its owner, not only its pid)."""

import json
import subprocess
import sys
import time

import pytest

from kvagent.bench import fidelity
from kvagent.bench import replay as rp
from kvagent.bench.episodes import from_messages
from kvagent.bench.fidelity.shared_results import SharedResults
from kvagent.bench.stream import build_stream
from kvagent.runspec import RunSpec


def _key(r):
    return (r["episode"], r["seed"])


def _rec(seed, episode="e"):
    return {"episode": episode, "seed": seed, "kl": 0.1 * seed}


def test_a_claimed_run_is_not_taken_again_and_a_saved_one_is_done(tmp_path):
    a, b = (SharedResults(tmp_path / "fidelity.json", _key) for _ in range(2))
    assert a.claim(("e", 1))
    assert not b.claim(("e", 1))  # a holds it
    assert b.claim(("e", 2))
    a.save(_rec(1), [])
    assert not b.claim(("e", 1))  # done now
    assert list((tmp_path / "running").glob("*"))  # b's claim on 2 is still there
    b.save(_rec(2), ["x"])
    assert not list((tmp_path / "running").glob("*"))
    data = json.loads((tmp_path / "fidelity.json").read_text())
    assert [r["seed"] for r in data["records"]] == [1, 2] and data["skipped"] == ["x"]


def test_a_save_keeps_what_another_process_wrote_meanwhile(tmp_path):
    a, b = (SharedResults(tmp_path / "fidelity.json", _key) for _ in range(2))
    a.save(_rec(1), [])
    b.save(_rec(2), [])
    a.save(_rec(3), [])
    a.save(_rec(1), [])  # the same run again is not a second record
    assert sorted(r["seed"] for r in a.read()) == [1, 2, 3]


def test_a_dead_process_claim_is_ignored_and_a_released_one_is_free(tmp_path):
    a, b = (SharedResults(tmp_path / "fidelity.json", _key) for _ in range(2))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert a.claim(("e", 1))
    a._claim_file(("e", 1)).write_text(json.dumps({"pid": dead.pid, "token": "gone"}))
    assert b.claim(("e", 1))  # its owner died mid-run
    b.release(("e", 1))
    assert a.claim(("e", 1))


@pytest.fixture(scope="module")
def stream(tiny_engine, episode_record):
    ep = from_messages("fixture", episode_record(turns=4)["messages"])
    return build_stream(ep, tiny_engine.tokenizer)


def test_two_workers_on_one_out_dir_run_each_setting_once(
    tiny_engine, stream, tmp_path, monkeypatch, together
):
    k = stream.prompt_length // 32 * 32 or 32
    grid = [RunSpec(policy="random", budget=k, buffer=16, protect="sink", seed=s) for s in range(4)]
    fidelity.run_fidelity(tiny_engine, [stream], [RunSpec("full")], tmp_path, "tiny", plot=False)
    runs, real = [], rp.policy_run

    def counted(engine, st, config, *a, **kw):
        runs.append(config.seed)
        time.sleep(0.3)  # both workers hold a run at once
        return real(engine, st, config, *a, **kw)

    monkeypatch.setattr(rp, "policy_run", counted)
    # Both read the same pending list: without claims each would run all four.
    results = together(
        lambda: fidelity.run_fidelity(tiny_engine, [stream], grid, tmp_path, "tiny", plot=False)
    )
    assert sorted(runs) == [0, 1, 2, 3]
    saved = fidelity.load_records(tmp_path)
    assert sorted(r["seed"] for r in saved if r["policy"] == "random") == [0, 1, 2, 3]
    assert not list((tmp_path / "running").glob("*"))
    # The worker that finished last saw every record, the other's included.
    assert max(len(r) for r in results) == 5


def test_a_torn_results_file_is_refused_with_its_fix(tmp_path):
    from kvagent.errors import ConfigError

    (tmp_path / "fidelity.json").write_text('{"records": [')
    with pytest.raises(ConfigError, match=r"fidelity.json is not valid JSON .*move it away"):
        fidelity.load_records(tmp_path)
    with pytest.raises(ConfigError, match="move it away"):
        SharedResults(tmp_path / "fidelity.json", _key).claim(("e", 1))
