"""A fidelity run keeps each episode's full-cache reference under out_dir/references, so a restart
(the study's case: many starts over days) compares against the same reference without replaying it,
and a torn file or another model's never stands in for it. Processes sharing one out dir share its
references: each is replayed once."""

import threading
import time

import pytest

from kvagent.bench import fidelity
from kvagent.bench import reference_cache as rc
from kvagent.bench import replay as rp
from kvagent.bench.episodes import from_messages
from kvagent.bench.stream import build_stream
from kvagent.runspec import RunSpec


@pytest.fixture(scope="module")
def stream(tiny_engine, episode_record):
    ep = from_messages("fixture", episode_record(turns=4)["messages"])
    return build_stream(ep, tiny_engine.tokenizer)


@pytest.fixture()
def replays(monkeypatch):
    """Counts the reference replays the run really does."""
    calls = []
    real = rp.reference_run

    def counted(engine, stream, **kw):
        calls.append(stream.name)
        return real(engine, stream, **kw)

    monkeypatch.setattr(rp, "reference_run", counted)
    return calls


def _spec(budget: int) -> RunSpec:
    return RunSpec(policy="random", budget=budget, buffer=16, protect="sink", seed=0)


def test_a_restart_reads_the_reference_it_wrote(tiny_engine, stream, replays, tmp_path):
    k = stream.prompt_length // 32 * 32 or 32
    first = fidelity.run_fidelity(tiny_engine, [stream], [_spec(k)], tmp_path, "tiny", plot=False)
    assert replays == ["fixture"]
    (path,) = (tmp_path / rc.REFERENCES).glob("*.pt")  # beside it: its lock file
    assert path == rc.reference_path(tmp_path, tiny_engine, stream, "tiny")
    # A new setting in the same out dir: compared against the reference on disk, not a new replay.
    both = fidelity.run_fidelity(
        tiny_engine, [stream], [_spec(k), _spec(k + 32)], tmp_path, "tiny", plot=False
    )
    assert replays == ["fixture"] and len(both) == 2
    fresh = fidelity.run_fidelity(
        tiny_engine, [stream], [_spec(k + 32)], tmp_path / "fresh", "tiny", plot=False
    )
    assert replays == ["fixture", "fixture"]
    by_budget = {r["budget"]: r for r in both}
    assert by_budget[k]["kl"] == first[0]["kl"]
    assert by_budget[k + 32]["kl"] == fresh[0]["kl"]  # the stored reference = a new one


def test_the_loaded_reference_equals_the_replayed_one(tiny_engine, stream, tmp_path):
    made = rc.cached_reference(tiny_engine, stream, tmp_path, "tiny")
    read = rc.cached_reference(tiny_engine, stream, tmp_path, "tiny")
    assert read is not made
    for name in ("ids", "logp", "argmax", "logp_true"):
        assert getattr(read.reference, name).equal(getattr(made.reference, name))
    assert read.logp_true == made.logp_true and read.probe_text == made.probe_text
    assert read.memory == made.memory and read.wall_s == made.wall_s


def test_a_torn_file_or_another_model_replays_again(tiny_engine, stream, replays, tmp_path):
    rc.cached_reference(tiny_engine, stream, tmp_path, "tiny")
    path = rc.reference_path(tmp_path, tiny_engine, stream, "tiny")
    path.write_bytes(path.read_bytes()[:100])
    rc.cached_reference(tiny_engine, stream, tmp_path, "tiny")
    assert len(replays) == 2
    assert rc.reference_path(tmp_path, tiny_engine, stream, "other") != path
    rc.cached_reference(tiny_engine, stream, tmp_path, "other")
    assert len(replays) == 3


def test_two_workers_replay_each_reference_once(tiny_engine, episode_record, tmp_path, monkeypatch, together):
    """Two processes started on one out dir: each takes the references the other has not, then
    waits for the other's, so none is replayed twice."""
    streams = [
        build_stream(from_messages(f"ep{t}", episode_record(turns=t)["messages"]), tiny_engine.tokenizer)
        for t in (3, 4)
    ]
    calls, real = [], rp.reference_run

    def slow(engine, stream, **kw):
        calls.append(stream.name)
        time.sleep(0.3)  # both workers reach the references while one is being replayed
        return real(engine, stream, **kw)

    monkeypatch.setattr(rp, "reference_run", slow)
    together(
        lambda: fidelity.run_fidelity(tiny_engine, streams, [RunSpec("full")], tmp_path, "tiny", plot=False)
    )
    assert sorted(calls) == ["ep3", "ep4"]
    assert len(fidelity.load_records(tmp_path)) == 2


def test_a_held_reference_is_waited_for_and_replayed_if_its_holder_wrote_none(
    tiny_engine, stream, replays, tmp_path
):
    path = rc.reference_path(tmp_path, tiny_engine, stream, "tiny")
    got = []
    with rc._replaying(path, wait=True):  # another process replaying it
        assert rc.cached_reference(tiny_engine, stream, tmp_path, "tiny", wait=False) is None
        waiter = threading.Thread(
            target=lambda: got.append(rc.cached_reference(tiny_engine, stream, tmp_path, "tiny"))
        )
        waiter.start()
        time.sleep(0.3)
        assert waiter.is_alive() and not replays  # blocked on the holder, not replaying beside it
    waiter.join()  # the holder let go without a file (it died): the waiter replays it
    assert replays == ["fixture"] and got[0] is not None and path.exists()


def test_the_study_times_a_free_reference_not_one_another_process_holds(
    tiny_engine, episode_record, replays, tmp_path
):
    from kvagent.bench.study import run as study

    a, b = (
        build_stream(from_messages(f"ep{t}", episode_record(turns=t)["messages"]), tiny_engine.tokenizer)
        for t in (3, 4)
    )
    refs = {}
    with rc._replaying(rc.reference_path(tmp_path, tiny_engine, a, "tiny"), wait=True):
        assert study._time_one(tiny_engine, [a, b], tmp_path, "tiny", refs) is b  # without waiting
    assert replays == ["ep4"] and list(refs) == [b.digest()]
