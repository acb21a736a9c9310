"""The third claim (`--claim segments`): the matching rule gives each token-level arm the K whose
mean KV entries equal the masking run's, the verdict follows the pre-registered rule, and a stopped
study continues where it stopped."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from kvagent.bench.episodes import Episode, default_probe
from kvagent.bench.stream import build_stream
from kvagent.bench.study import segments as sg

TINY = replace(sg.SEGMENTS, keep=1, named=("snapkv", "random"), min_observations=3, n_episodes=2,
               clip_chars=200, clip_prompt_chars=200)  # fmt: skip


def messages(k: int, n_obs: int = 4) -> list[dict]:
    msgs = [
        {"role": "system", "content": "You fix bugs."},
        {"role": "user", "content": f"Issue {k}: x.py fails."},
    ]
    for i in range(n_obs):
        msgs += [{"role": "assistant", "content": f"Step {i}: look at file {k}-{i}.\n<function=view>\n</function>"},
                 {"role": "tool", "content": "\n".join(f"line {j} of output {i}" for j in range(3 + i))}]  # fmt: skip
    return [*msgs, {"role": "assistant", "content": "Done."}]


def test_the_matched_budget_equals_the_masking_runs_mean_entries(tiny_engine):
    ep = sg.prepare(TINY, Episode("e", messages(0, 6), probe=default_probe()))
    s = build_stream(ep, tiny_engine.tokenizer)
    assert sg.eligible(TINY, s) is None and len(s.observations) == 6
    full = sg.token_kv_mean(s, len(s.ids) * 2, TINY.buffer)  # a K never reached: the whole stream
    for mode in TINY.modes:
        target = sg.masking_kv_mean(TINY, s, mode)
        k = sg.matched_budget(TINY, s, mode)
        assert target < full and k % 32 == 0
        got = sg.token_kv_mean(s, k, TINY.buffer)
        # no other block multiple comes closer
        assert all(
            abs(sg.token_kv_mean(s, k2, TINY.buffer) - target) >= abs(got - target)
            for k2 in range(32, 4096, 32)
        )
    # the fact in a reply is planted in the first reply and asked as the second probe
    assert "5182-KWZ" in next(m for m in ep.messages if m["role"] == "assistant")["content"]
    assert len(s.extra_probes) == 1
    assert sg.eligible(replace(TINY, min_observations=7), s).startswith("6 tool outputs")


def _records(ratio_by_episode, modes=("persistent", "reprefill")):
    recs = []
    for e, ratio in ratio_by_episode.items():
        for mode in modes:
            recs.append({"episode": e, "mode": mode, "policy": "full", "history": TINY.history, "status": "ok",
                         "kl": 0.1 * ratio, "top1": 0.9})  # fmt: skip
            for base in TINY.named:
                recs.append(
                    {"episode": e, "mode": mode, "policy": base, "status": "ok", "kl": 0.1, "top1": 0.9}
                )
    return recs


@pytest.mark.parametrize(
    ("ratios", "verdict"),
    [
        ({"a": 0.5, "b": 0.5}, "supported"),  # better everywhere, no spread
        ({"a": 1.1, "b": 1.1}, "supported"),  # worse, but inside the margin 1.25 with no spread: non-inferior
        ({"a": 2.0, "b": 2.0}, "contradicted"),  # worse beyond the margin
        ({"a": 0.5, "b": 2.0}, "inconclusive"),
    ],
)
def test_the_verdict_rule(ratios, verdict):
    a = sg.analyse(_records(ratios), TINY, list(ratios))
    assert a["verdict"] == verdict
    assert len(a["rows"]) == TINY.family == 4


def test_no_verdict_before_every_chosen_episode_has_run():
    a = sg.analyse(_records({"a": 0.5}), TINY, ["a", "b"])
    assert a["verdict"].startswith("none yet")


def _tiny_study(tmp_path, monkeypatch, study_cli):
    """The out dir and command line of a `--claim segments` run under the TINY design, two episodes."""
    monkeypatch.setitem(sg.DESIGNS, "segments", TINY)
    eps = tmp_path / "eps.jsonl"
    eps.write_text("".join(json.dumps({"id": f"ep{k}", "messages": messages(k)}) + "\n" for k in range(2)))
    out = tmp_path / "study"
    return out, study_cli.args("segments", eps, out)


def test_a_stopped_segments_study_continues_where_it_stopped(tmp_path, monkeypatch, study_cli):
    from typer.testing import CliRunner

    from kvagent.cli.app import app

    out, args = _tiny_study(tmp_path, monkeypatch, study_cli)
    calls = study_cli.stop_after(3)
    stopped = CliRunner().invoke(app, args)
    assert stopped.exit_code == 130 and "rerun the same command to resume" in stopped.output
    kept = json.loads((out / "fidelity.json").read_text())["records"]
    assert len(kept) == 2 + 3  # two references, three finished runs
    assert sum(r.get("history") == TINY.history for r in kept) == 2  # masking first, on both episodes

    report = CliRunner().invoke(app, [*args, "--report-only"])
    assert report.exit_code == 0, report.output
    assert json.loads((out / "study.json").read_text())["verdict"].startswith("none yet")

    calls = study_cli.count()
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, again.output
    per_episode = 2 * (1 + len(TINY.named))  # per mode: masking + the token-level arms
    assert len(calls) == 2 * per_episode - 3  # only the missing runs
    recs = json.loads((out / "fidelity.json").read_text())["records"]
    assert len(recs) == 2 + 2 * per_episode
    a = json.loads((out / "study.json").read_text())
    assert not a["verdict"].startswith("none yet") and len(a["rows"]) == 4
    masked = [r for r in recs if r.get("history")]
    tokens = [r for r in recs if r["policy"] in TINY.named]
    assert all(r["kv_mean"] < next(f for f in recs if f["policy"] == "full" and not f.get("history")
                                   and f["episode"] == r["episode"])["kv_mean"] for r in masked)  # fmt: skip
    assert {r["budget"] % 32 for r in tokens} == {0}


def test_segments_estimate_only_chooses_and_runs_nothing(tmp_path, monkeypatch, study_cli):
    """`--estimate-only` names the episodes and the runs each takes and stops: no run, no file (it
    used to start the whole study); `--concurrency` other than 1 is refused in one line."""
    from typer.testing import CliRunner

    from kvagent.bench import replay
    from kvagent.cli.app import app

    out, args = _tiny_study(tmp_path, monkeypatch, study_cli)
    monkeypatch.setattr(replay, "policy_run", lambda *a, **k: pytest.fail("--estimate-only ran a replay"))
    result = CliRunner().invoke(app, [*args, "--estimate-only"])
    assert result.exit_code == 0, result.output
    assert (
        f"{1 + 2 * (1 + len(TINY.named))} runs each" in result.output
    )  # the reference too and "no run started" in result.output
    assert not out.exists()
    refused = CliRunner().invoke(app, [*args, "--concurrency", "2"])
    assert (
        refused.exit_code == 2
        and "concurrency: the segments design runs one replay at a time" in refused.output
    )
