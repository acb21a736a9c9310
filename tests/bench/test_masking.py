"""Observation masking in replays (bench/masking.py): the stream marks each observation's content,
persistent replays forget the older ones from every layer and head, reprefill replays re-send them
as the placeholder line byte for byte, and a masked run is its own record beside the reference."""

from __future__ import annotations

import pytest

from kvagent.bench.episodes import Episode, Probe, default_probe
from kvagent.bench.fidelity import load_records, run_fidelity
from kvagent.bench.masking import HistorySpec, Masker, keep_of
from kvagent.bench.stream import build_stream
from kvagent.errors import ConfigError
from kvagent.runspec import RunSpec
from kvagent.runtime import CacheConfig

OBS = ["first one\nfirst two\nfirst three", "second", "third a\nthird b", "fourth"]


def episode(probe=True):
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "issue text"}]
    for i, o in enumerate(OBS):
        msgs += [{"role": "assistant", "content": f"call {i}"}, {"role": "tool", "content": o}]
    msgs.append({"role": "assistant", "content": "done"})
    extra = (Probe("What is the tag?", "The tag is", "5182-KWZ"),) if probe else ()
    return Episode("m", msgs, probe=default_probe() if probe else None, extra_probes=extra)


def play(engine, stream, config, keep):
    """The replay's loop with the masker, keeping the session to look at."""
    session, masker, pos = engine.session(config), Masker(stream, keep), 0
    for seg in stream.segments:
        if seg.kind == "append":
            session.append(masker(session, pos, list(seg.ids)))
        else:
            session.teacher_force(list(seg.ids))
        pos += len(seg.ids)
    return session


def test_stream_marks_each_observation_and_its_placeholder(tiny_engine):
    tok = tiny_engine.tokenizer
    s = build_stream(episode(probe=False), tok)
    assert [tok.decode(s.ids[o.start : o.end]) for o in s.observations] == OBS
    assert tok.decode(s.observations[0].placeholder) == "Old environment output: (3 lines omitted)"
    assert tok.decode(s.observations[1].placeholder) == "Old environment output: (1 lines omitted)"
    # the issue (a user turn before the first reply) is not an observation
    assert all(o.start > s.prompt_length for o in s.observations)
    steps, pos = [], 0
    for seg in s.segments:
        steps += [pos] if seg.kind == "step" else []
        pos += len(seg.ids)
    assert s.segment_starts == sorted([o.start for o in s.observations] + steps)  # what replays mark


@pytest.mark.parametrize("policy", ["full", "snapkv"])
def test_persistent_masking_forgets_the_older_observations(tiny_engine, policy):
    s = build_stream(episode(probe=False), tiny_engine.tokenizer)
    budget = None if policy == "full" else 64
    session = play(
        tiny_engine, s, CacheConfig(policy=policy, budget=budget, buffer=16, protect="sink"), keep=2
    )
    o = s.observations
    gone = set(range(o[0].start, o[0].end)) | set(range(o[1].start, o[1].end))
    held = [
        {int(p) for p in head.tolist() if p >= 0} for layer in session.kept_positions() for head in layer[0]
    ]
    assert all(not h & gone for h in held)
    if policy == "full":  # the rest untouched
        assert all(h == set(range(len(s.ids))) - gone for h in held)


def test_reprefill_masking_resends_the_placeholder_byte_for_byte(tiny_engine):
    tok = tiny_engine.tokenizer
    s = build_stream(episode(probe=False), tok)
    session = play(tiny_engine, s, CacheConfig(policy="full", mode="reprefill"), keep=2)
    text = tok.decode(session.history)
    want = (
        "<|im_start|>user\nOld environment output: (3 lines omitted)<|im_end|>\n<|im_start|>assistant\ncall 1"
        "<|im_end|>\n<|im_start|>user\nOld environment output: (1 lines omitted)<|im_end|>\n"
        "<|im_start|>assistant\ncall 2<|im_end|>\n<|im_start|>user\nthird a\nthird b<|im_end|>"
    )
    assert want in text and "first one" not in text and "fourth" in text
    assert session.history[: s.prompt_length] == s.ids[: s.prompt_length]


@pytest.mark.parametrize("mode", ["persistent", "reprefill"])
def test_a_masked_replay_marks_each_segment_where_it_starts_in_the_session(tiny_engine, mode):
    """The replay marks a segment as it is fed, and a reprefill re-send moves the marks it takes
    back: each names where a reply or an observation (placeholder or whole) starts in the history the
    session holds, so the segment-aware policy groups the tokens the paper's agent re-sent."""
    from kvagent.bench.replay import replay

    s = build_stream(episode(probe=False), tiny_engine.tokenizer)
    masker, seen = Masker(s, keep=2), []

    def before_append(session, pos, ids):
        seen.append(session)
        return masker(session, pos, ids)

    cfg = CacheConfig(policy="segments", budget=64, buffer=16, protect="sink", mode=mode)
    replay(tiny_engine, s, cfg, lambda *a: None, probe=False, before_append=before_append)
    session = seen[-1]
    # a stream position's place in the session: less what the placeholders before it saved
    saved = [(o.end, (o.end - o.start) - len(o.placeholder)) for o in s.observations[:2]]
    shift = (lambda p: sum(n for end, n in saved if end <= p)) if mode == "reprefill" else (lambda p: 0)
    assert masker.shrunk == (sum(n for _, n in saved) if mode == "reprefill" else 0)
    assert session.segment_starts == tuple(p - shift(p) for p in s.segment_starts)
    step_starts = [p for p in s.segment_starts if p not in {o.start for o in s.observations}]
    for p in step_starts:  # each reply's first token sits at its mark in the session too
        assert session.history[p - shift(p)] == s.ids[p]


def test_history_spec_is_its_own_run(tiny_engine, tmp_path):
    assert keep_of("mask-observations") == 10 and keep_of("keep") is None
    with pytest.raises(ConfigError, match="history"):
        keep_of("drop-thinking+mask-observations")
    spec = HistorySpec("full", history="mask-observations=2")
    assert spec.label == "full__persistent__dense__mask-observations=2"
    assert spec.record()["history"] == "mask-observations=2" and spec != RunSpec("full")
    assert spec.canonical is spec and HistorySpec("full", mode="reprefill").canonical.mode == "persistent"
    s = build_stream(episode(), tiny_engine.tokenizer)
    grid = [RunSpec("full"), spec, HistorySpec("snapkv", budget=64, buffer=16)]
    recs = run_fidelity(tiny_engine, [s], grid, tmp_path, "tiny", plot=False)
    by = {r.get("history"): r for r in recs if r["policy"] == "full"}
    assert by[None]["kl"] == 0.0 and by["mask-observations=2"]["kl"] > 0.0  # masking changed logits
    assert by["mask-observations=2"]["kv_mean"] < by[None]["kv_mean"]
    assert len(by["mask-observations=2"]["extra_probes"]) == 1  # the fact in a reply was asked too
    # resumes: the three records are found again (the masked one by its history), nothing reruns
    again = run_fidelity(tiny_engine, [s], grid, tmp_path, "tiny", plot=False)
    assert len(load_records(tmp_path)) == 3 and [r["wall_s"] for r in again] == [r["wall_s"] for r in recs]


def test_bench_fidelity_history_option_runs_masking_beside_each_setting(tmp_path):
    import json

    from typer.testing import CliRunner

    from kvagent.cli.app import app

    eps = tmp_path / "eps.jsonl"
    msgs = episode(probe=False).messages
    eps.write_text(json.dumps({"id": "m", "messages": msgs}) + "\n")
    args = ["bench", "fidelity", "--model", "tiny-random-qwen3", "--device", "cpu", "--policies", "full,snapkv",
            "--modes", "persistent", "--budgets", "64", "--buffer", "16", "--episodes", f"{eps}:plant=0",
            "--out", str(tmp_path / "out"), "--quiet", "--history", "keep,mask-observations=2"]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    recs = json.loads((tmp_path / "out" / "fidelity.json").read_text())["records"]
    got = sorted((r["policy"], r.get("history") or "keep") for r in recs)
    assert got == [("full", "keep"), ("full", "mask-observations=2"), ("snapkv", "keep"),
                   ("snapkv", "mask-observations=2")]  # fmt: skip
    table = (tmp_path / "out" / "fidelity.md").read_text()
    assert "full+mask-observations=2" in table and "snapkv+mask-observations=2" in table
    bad = CliRunner().invoke(app, [*args[:-1], "drop-thinking"])
    assert bad.exit_code == 2 and "history" in bad.output
