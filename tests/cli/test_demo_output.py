"""Issue 31: the demo's output on a tiny model and a short episode: the picture's data (KV memory over
the episode, fidelity per turn) and the table (the probe column only where `full` retrieves)."""

from __future__ import annotations

import json

import pytest

from kvagent.bench.demo.series import memory_band
from kvagent.cli.settings import EngineOptions


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from kvagent.cli.demo import run_demo

    out = tmp_path_factory.mktemp("demo")
    records = run_demo(
        EngineOptions(model="tiny-random-qwen3"),
        out=str(out),
        budget=512,
        turns=10,
        progress=False,
        policies=("random", "nexus"),
    )
    return out, records


def test_the_memory_series_grows_for_full_and_stays_within_k_plus_r_for_every_evicting_run(demo):
    out, _ = demo
    records = json.loads((out / "fidelity.json").read_text())["records"]
    assert [(r["policy"], r["mode"], r["history"]) for r in records if r.get("history")] == [
        ("full", "persistent", "mask-observations=4")
    ]  # the observation-masking row: the full cache, older tool outputs forgotten
    assert {(r["policy"], r["mode"]) for r in records if r["policy"] != "full"} == {
        ("random", "persistent"), ("random", "reprefill"), ("nexus", "persistent"), ("nexus", "reprefill"),
    }  # fmt: skip
    for r in records:
        tokens = [p[0] for p in r["memory"]]
        held = [p[1] for p in r["memory"]]
        assert tokens == sorted(tokens) and tokens[-1] == r["tokens"], r["policy"]  # the whole episode
        if r.get("history"):  # dense but for the forgotten tool outputs
            assert held[-1] < tokens[-1] and all(h <= t for h, t in zip(held, tokens, strict=True))
        elif r["policy"] == "full":
            assert held == sorted(held) and held == tokens  # dense: every token fed is held
            assert memory_band(r) is None
        else:
            # The run's own framework sets its peak: a round at K + r back to K (topk-all, and every
            # record written before the setting), or K + r kept after a round and K + 2r at the peak
            # (recent-buffer: the r newest are never candidates).
            peak_rs = 2 if r.get("framework", "topk-all") == "recent-buffer" else 1
            low, high = memory_band(r)
            assert (low, high) == (
                r["budget"] + (peak_rs - 1) * r["buffer"],
                r["budget"] + peak_rs * r["buffer"],
            )
            assert max(held) <= high, (r["policy"], r["mode"], max(held), high)
            assert max(held) > low, (r["policy"], r["mode"], max(held), low)  # it filled into its band
            assert r["rounds"] > 0
        assert len(r["turn_kl"]) == len(r["turn_top1"]) == len(r["turn_end"]) == r["turns"]
        assert (max(r["turn_kl"]) == 0.0) == (r["policy"] == "full" and not r.get("history"))
    assert (out / "demo.png").stat().st_size > 10_000


def test_the_probe_column_is_shown_only_when_full_retrieves_the_fact(demo, capsys):
    from kvagent.cli.demo import _print_table

    _, records = demo
    full = next(r for r in records if r["policy"] == "full")
    assert full["probe_retrieved"] is False  # a random-weight model retrieves nothing
    capsys.readouterr()
    _print_table(records, "tiny on gen", 2)
    plain = capsys.readouterr().out
    assert "fact retrieved" not in plain and "log p(fact)" not in plain and "random" in plain
    assert "masked M=4" in plain  # the observation-masking row
    retrieved = [{**r, "probe_retrieved": True} if r["policy"] == "full" else r for r in records]
    _print_table(retrieved, "tiny on gen", 2)
    shown = capsys.readouterr().out
    assert "fact retrieved" in shown and "log p(fact)" in shown


def test_the_demo_names_the_episode_and_model_above_the_table_and_explains_nexus_rounds(demo, capsys):
    from kvagent.cli.demo import _print_table

    _, records = demo
    capsys.readouterr()
    _print_table(records, "tiny-random-qwen3 on gen-s0-t10-compact", 2)
    out = " ".join(capsys.readouterr().out.split())  # the caption wraps
    assert out.index("tiny-random-qwen3 on gen-s0-t10-compact") < out.index("random")
    assert "nexus keeps whole 32-entry blocks" in out
    # one framework for every run, named once in the title, so the policy column holds plain names
    assert "nexus+" not in out and "random+" not in out
    peak = memory_band(next(r for r in records if r["policy"] == "nexus"))[1]
    assert f"reached K+{'2' if peak - 512 == 256 else ''}r={peak} at that moment" in out


def test_the_title_names_the_runs_own_framework():
    from kvagent.cli.demo import framework_text

    runs = [{"policy": "full"}, {"policy": "random", "framework": "recent-buffer"}]
    assert framework_text(runs) == "framework recent-buffer (the newest r never scored)"
    older = [{"policy": "full"}, {"policy": "random"}]  # written before the setting: topk-all
    assert framework_text(older) == "framework topk-all (top K of every entry)"
