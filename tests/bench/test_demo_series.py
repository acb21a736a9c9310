"""The demo's planted fact (`fact="port"`) and the per-run series its picture plots."""

from __future__ import annotations

import pytest

from kvagent.bench.demo.series import fact_position, memory_band, memory_bound, series
from kvagent.bench.episodes import Episode
from kvagent.bench.generator import generate_episode
from kvagent.bench.replay import ReplayResult
from kvagent.bench.stream import build_stream
from kvagent.cli.environments import scripted_sandbox
from kvagent.errors import ConfigError


@pytest.fixture(scope="module")
def port_episode():
    return generate_episode(seed=0, turns=10, prompt="compact", open_env=scripted_sandbox, fact="port")


def test_the_port_fact_is_stated_in_the_notes_and_asked_for_at_the_end(port_episode):
    notes = next(m["content"] for m in port_episode.messages if "Deployment notes" in m["content"])
    assert "The staging server listens on port 8471." in notes and "deploy key" not in notes
    p = port_episode.probe
    assert (p.value, p.answer_prefix) == ("8471", "The staging server listens on port")
    assert port_episode.name == "gen-s0-t10-compact-port"
    other = generate_episode(seed=5, turns=10, prompt="compact", open_env=scripted_sandbox, fact="port")
    assert other.probe.value != "8471" and f"port {other.probe.value}." in str(other.messages)
    with pytest.raises(ConfigError, match="fact='pin'.*key, port"):
        generate_episode(seed=0, turns=10, open_env=scripted_sandbox, fact="pin")


def test_series_gives_per_turn_means_and_where_the_fact_is(port_episode, tokenizer):
    stream = build_stream(port_episode, tokenizer)
    steps = [s for s in stream.segments if s.kind == "step"]
    n = stream.n_scored
    kl = [float(i) for i in range(n)]
    agree = [i % 2 == 0 for i in range(n)]
    res = ReplayResult(kl=kl, agree=agree, memory=[(10, 10), (20, 15)])
    out = series(stream, res)
    first = len(steps[0].ids)
    assert out["turn_kl"][0] == pytest.approx(sum(range(first)) / first)
    assert out["turn_kl"][-1] == pytest.approx(sum(kl[n - len(steps[-1].ids) :]) / len(steps[-1].ids))
    assert len(out["turn_end"]) == len(out["turn_top1"]) == stream.n_turns
    assert out["turn_end"][-1] == len(stream.ids) and out["memory"] == [[10, 10], [20, 15]]
    at = out["fact_at"]
    assert stream.ids[at : at + len(stream.probe.value)] == list(stream.probe.value)
    assert "8471" in tokenizer.decode(stream.ids[at - 8 : at + len(stream.probe.value)])
    assert fact_position(build_stream(Episode("no-probe", port_episode.messages), tokenizer)) is None


def test_memory_band_reads_the_runs_own_capacity_and_buffer():
    assert memory_band({"policy": "random", "budget": 512, "buffer": 128, "capacity": 640}) == (512, 640)
    assert memory_band({"policy": "nexus", "budget": 1024, "buffer": 64, "capacity": 1152}) == (1088, 1152)
    assert memory_bound({"policy": "nexus", "budget": 1024, "buffer": 64, "capacity": 1152}) == 1152
    assert memory_band({"policy": "full", "budget": None, "buffer": 128, "capacity": None}) is None
    assert memory_band({"policy": "random", "budget": 512, "buffer": 128}) is None  # an older record
