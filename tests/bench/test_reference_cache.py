"""A fidelity run keeps each episode's full-cache reference under out_dir/references, so a restart
(the study's case: many starts over days) compares against the same reference without replaying it,
and a torn file or another model's never stands in for it."""

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
    (path,) = (tmp_path / rc.REFERENCES).iterdir()
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
