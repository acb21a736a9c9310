"""The third claim's second design (`--claim segments-replication`): it runs the held-out eligible
episodes (none of the first design's), the segments policy is an arm at the same matched K as the
token-level arms, its primary family has 2 x 4 x 2 = 16 comparisons with Holm over all of them, the
first design's analysis is unchanged, and a stopped run continues where it stopped."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvagent.bench.episodes import Episode, default_probe
from kvagent.bench.stream import build_stream
from kvagent.bench.study import segments as sg

FIRST = Path(__file__).parents[2] / "docs" / "study" / "segments"
REP = sg.SEGMENTS_REPLICATION


def _fake_streams(rows):
    """Streams as far as `select` reads them, from a committed design.json's rows."""
    return [
        SimpleNamespace(
            name=r["name"],
            ids=[0] * r["tokens"],
            observations=[None] * r["observations"],
            probe=None if (r["reason"] or "").startswith("no planted") else object(),
            extra_probes=(sg.REPLY_FACT,),
        )
        for r in rows
    ]


def test_the_replication_runs_held_out_episodes_only():
    first = json.loads((FIRST / "design.json").read_text())
    streams = _fake_streams(first["rows"])
    # the same rule picks the first design's episodes again from the same rows ...
    picked, _ = sg.select(sg.SEGMENTS, streams)
    assert [s.name for s in picked] == first["chosen"]
    # ... and the replication the next 4 eligible ones in file order, none of them
    chosen, rows = sg.select(REP, streams)
    names = [s.name for s in chosen]
    eligible = [
        r["name"]
        for r in first["rows"]
        if r["reason"] in (None, "eligible, held out (past the planned count)")
    ]
    assert len(eligible) == 20 and eligible[:3] == first["chosen"]
    assert names == eligible[3:7] and not set(names) & set(first["chosen"])
    why = {r["name"]: r["reason"] for r in rows}
    assert all(why[n].startswith("eligible, run by the earlier design") for n in first["chosen"])
    assert all(why[n] is None for n in names)
    assert sum((why[n] or "").endswith("past the planned count)") for n in eligible) == 20 - 3 - 4
    assert REP.n_episodes == 4 and REP.skip == sg.SEGMENTS.n_episodes


def messages(k: int, n_obs: int = 4) -> list[dict]:
    msgs = [
        {"role": "system", "content": "You fix bugs."},
        {"role": "user", "content": f"Issue {k}: x.py fails."},
    ]
    for i in range(n_obs):
        msgs += [{"role": "assistant", "content": f"Step {i}: look at file {k}-{i}.\n<function=view>\n</function>"},
                 {"role": "tool", "content": "\n".join(f"line {j} of output {i}" for j in range(3 + i))}]  # fmt: skip
    return [*msgs, {"role": "assistant", "content": "Done."}]


TINY = replace(REP, keep=1, named=("snapkv", "random"), min_observations=3, n_episodes=2, skip=1,
               clip_chars=200, clip_prompt_chars=200)  # fmt: skip


def test_the_segments_arm_is_matched_like_the_token_level_arms(tiny_engine):
    s = build_stream(
        sg.prepare(REP, Episode("e", messages(0, 6), probe=default_probe())), tiny_engine.tokenizer
    )
    specs = sg.specs_for(replace(REP, min_observations=3, keep=1), s)
    assert len(specs) == 1 + 2 * (1 + 1 + 4)  # the reference; per mode masking, segments, 4 token-level
    for mode in REP.modes:
        k = sg.matched_budget(replace(REP, keep=1), s, mode)
        evicting = [sp for sp in specs if sp.mode == mode and sp.budget]
        assert {sp.policy for sp in evicting} == {"segments", *REP.named}
        seg = next(sp for sp in evicting if sp.policy == "segments")
        assert dict(seg.policy_args) == {"scorer": "snapkv"} and REP.scorer == "snapkv"
        for sp in evicting:  # everything but the policy is the same run
            assert (sp.budget, sp.protect, sp.framework, sp.buffer, sp.window, sp.seed) == (
                k,
                "prompt",
                "recent-buffer",
                32,
                16,
                0,
            )
    # the replay marks every reply and observation: the segments policy has segments to rank
    assert len(s.segment_starts) == len(s.observations) + sum(g.kind == "step" for g in s.segments)
    # the first design is unchanged: no segments arm
    assert "segments" not in {sp.policy for sp in sg.specs_for(replace(sg.SEGMENTS, keep=1), s)}


def _records(masking: float, segments: float, episodes=("a", "b", "c", "d"), spread=0.0):
    recs = []
    for i, e in enumerate(episodes):
        w = math.exp(spread * (i - 1.5))
        for mode in REP.modes:
            recs.append({"episode": e, "mode": mode, "policy": "full", "history": REP.history, "status": "ok",
                         "kl": 0.1 * masking * w, "top1": 0.9})  # fmt: skip
            recs.append({"episode": e, "mode": mode, "policy": "segments", "policy_args": {"scorer": "snapkv"},
                         "status": "ok", "kl": 0.1 * segments * w, "top1": 0.9})  # fmt: skip
            for base in REP.named:
                recs.append(
                    {"episode": e, "mode": mode, "policy": base, "status": "ok", "kl": 0.1, "top1": 0.9}
                )
    return recs


def test_the_family_is_both_subjects_against_every_token_level_arm_in_both_modes():
    chosen = ["a", "b", "c", "d"]
    a = sg.analyse(_records(0.5, 0.7, spread=0.05), REP, chosen)
    assert REP.family == 16 and len(a["rows"]) == 16
    assert {(r["subject"], r["baseline"], r["mode"]) for r in a["rows"]} == {
        (s, b, m) for s in ("masking", "segments") for b in REP.named for m in REP.modes
    }
    # Holm over all 16: the smallest p is multiplied by 16, not by a subject's 8
    smallest = min(a["rows"], key=lambda r: r["p_better"])
    assert smallest["holm_better"] == pytest.approx(min(1.0, 16 * smallest["p_better"]))
    assert a["verdict"] == "supported" and a["by_subject"] == {
        "masking": "supported",
        "segments": "supported",
    }
    assert [r["mode"] for r in a["secondary"]] == list(REP.modes)
    assert a["secondary"][0]["ratio"] == pytest.approx(0.5 / 0.7)
    # the segments policy worse beyond the margin contradicts the claim, whatever masking does
    b = sg.analyse(_records(0.5, 2.0, spread=0.05), REP, chosen)
    assert b["verdict"] == "contradicted" and b["by_subject"] == {
        "masking": "supported",
        "segments": "contradicted",
    }
    # a segments record with another scorer is not this design's arm
    other = [
        {**r, "policy_args": {"scorer": "tova"}} if r["policy"] == "segments" else r
        for r in _records(0.5, 0.7)
    ]
    c = sg.analyse(other, REP, chosen)
    assert c["verdict"].startswith("none yet") and all(
        r["n"] == 0 for r in c["rows"] if r["subject"] == "segments"
    )
    assert "segments" in sg.report_markdown(a, REP, [])


def test_the_first_designs_committed_analysis_is_unchanged():
    committed = json.loads((FIRST / "study.json").read_text())
    records = json.loads((FIRST / "fidelity.json").read_text())["records"]
    again = sg.analyse(records, sg.SEGMENTS, committed["chosen"])
    assert again["verdict"] == committed["verdict"] and len(again["rows"]) == sg.SEGMENTS.family == 8
    for new, old in zip(again["rows"], committed["rows"], strict=True):
        assert (new["baseline"], new["mode"], new["outcome"]) == (
            old["baseline"],
            old["mode"],
            old["outcome"],
        )
        for key in ("ratio", "holm_noninferior", "holm_better", "holm_worse"):
            assert new[key] == pytest.approx(old[key])


def test_a_stopped_replication_continues_where_it_stopped(tmp_path, monkeypatch, study_cli):
    from typer.testing import CliRunner

    from kvagent.cli.app import app

    monkeypatch.setitem(sg.DESIGNS, REP.claim, TINY)
    eps = tmp_path / "eps.jsonl"
    eps.write_text("".join(json.dumps({"id": f"ep{k}", "messages": messages(k)}) + "\n" for k in range(4)))
    out = tmp_path / "study"
    args = study_cli.args(REP.claim, eps, out)
    calls = study_cli.stop_after(3)
    stopped = CliRunner().invoke(app, args)
    assert stopped.exit_code == 130 and "rerun the same command to resume" in stopped.output
    design = json.loads((out / "design.json").read_text())
    assert design["claim"] == REP.claim and design["chosen"] == ["ep1", "ep2"]  # ep0 is the earlier design's
    assert len(json.loads((out / "fidelity.json").read_text())["records"]) == 2 + 3

    calls = study_cli.count()
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, again.output
    per_episode = 2 * (1 + 1 + len(TINY.named))  # per mode: masking, segments, the token-level arms
    assert len(calls) == 2 * per_episode - 3  # only the missing runs
    recs = json.loads((out / "fidelity.json").read_text())["records"]
    assert len(recs) == 2 + 2 * per_episode and {r["episode"] for r in recs} == {"ep1", "ep2"}
    a = json.loads((out / "study.json").read_text())
    assert not a["verdict"].startswith("none yet") and len(a["rows"]) == TINY.family == 8
    for e in ("ep1", "ep2"):
        for mode in TINY.modes:
            ks = {
                r["policy"]: r["budget"]
                for r in recs
                if r["episode"] == e and r["mode"] == mode and r["budget"]
            }
            assert set(ks) == {"segments", *TINY.named} and len(set(ks.values())) == 1
    # the first design's out dir is refused
    (tmp_path / "first").mkdir()
    (tmp_path / "first" / "design.json").write_text(
        json.dumps({"claim": "segments", "chosen": [], "rows": []})
    )
    refused = CliRunner().invoke(app, [*args[:-3], "--out", str(tmp_path / "first"), "--quiet"])
    assert refused.exit_code != 0 and "holds another study" in refused.output
