"""One declaration of what identifies a run (issue 25): `CacheConfig`'s fields, less the how-settings,
are the run spec, its record, its label and the report's configuration; labels and records already on
disk keep their meaning."""

import json
import subprocess
import sys
import textwrap
from dataclasses import fields

import pytest

from kvagent.evals.runner import EvalRun
from kvagent.evals.stats import config_of, summarize
from kvagent.runspec import DEFAULTS, HOW_NOT_WHICH, IDENTITY, NOT_IN_LABEL, RunSpec, sweep
from kvagent.runtime.config import CacheConfig

# A valid non-default value of every identity field (a field added to CacheConfig needs one here).
EXAMPLES = {"policy": "h2o", "budget": 128, "buffer": 32, "protect": "sink", "scope": "prefill",
            "mode": "reprefill", "window": 8, "seed": 3, "policy_args": {"kernel": 5}, "head_budget": "adaptive",
            "framework": "topk-all", "cadence": "shared"}  # fmt: skip


def test_labels_and_run_ids_are_those_already_on_disk():
    # (spec, label): the spellings run directories, fidelity files and predictions carry today. Those
    # runs were all of the topk-all framework (issue #26), whose labels show no framework.
    old = {"framework": "topk-all"}
    cases = [
        (RunSpec("full"), "full__persistent__dense"),
        (RunSpec("full", mode="reprefill", scope="prefill"), "full__reprefill__dense__prefill"),
        (RunSpec("nexus", budget=1024, **old), "nexus__persistent__K1024"),
        (RunSpec("random", budget=0.2, protect="sink", **old), "random__persistent__K0.2__protect-sink"),
        (RunSpec("snapkv", budget=64, scope="prefill", protect="none", head_budget="adaptive", **old),
         "snapkv__persistent__K64__prefill__protect-none__heads-adaptive"),
        # buffer, window, seed and policy options never were in labels
        (RunSpec("h2o", budget=64, buffer=8, window=4, seed=2, policy_args={"recent": 0.25}, **old),
         "h2o__persistent__K64"),
        # the papers' framework, the default since, is named, so no such run joins an old one
        (RunSpec("nexus", budget=1024), "nexus__persistent__K1024__recent-buffer"),
        (RunSpec("random", budget=0.2, protect="sink"), "random__persistent__K0.2__protect-sink__recent-buffer"),
    ]  # fmt: skip
    for spec, label in cases:
        assert spec.label == label
    # A dense run never evicts, so no framework is part of it: old and new dense records are one run.
    assert RunSpec("full", framework="recent-buffer") == RunSpec("full", framework="topk-all")
    # A dense run has no budget and no heads to budget: one run serves every such setting.
    assert RunSpec("full", budget=512, head_budget="adaptive") == RunSpec("full")
    (full,) = [
        s
        for s in sweep(["full", "snapkv"], ["persistent"], [64], head_budget="adaptive")
        if s.policy == "full"
    ]
    assert full.label == "full__persistent__dense"


def test_every_cache_field_is_part_of_the_spec_or_declared_a_how_setting():
    assert set(EXAMPLES) == set(IDENTITY), "add the new field's example value here"
    assert set(IDENTITY) | set(HOW_NOT_WHICH) == {f.name for f in fields(CacheConfig)}
    base = RunSpec("snapkv", budget=64)
    for name, value in EXAMPLES.items():
        spec = RunSpec(**{**base.record(), name: value})
        assert spec.record()[name] == value
        assert RunSpec.from_record(json.loads(json.dumps(spec.record()))) == spec
        assert spec.cache_config().to_dict()[name] == value
        assert (spec.label != base.label) == (name not in NOT_IN_LABEL), name
        assert (config_of(spec.record()) != config_of(base.record())) == (name not in NOT_IN_LABEL), name
    # How-settings go to the session, never into the spec.
    assert RunSpec.of(CacheConfig("nexus", budget=1024, audit=True, prefill_chunk=8)) == RunSpec(
        "nexus", budget=1024
    )
    assert RunSpec("nexus", budget=1024).cache_config(audit=True).audit


def test_old_records_keep_their_meaning():
    # Eval records from before scope / protect / head_budget / buffer / window / framework were recorded.
    old = {"run_id": "i__random__persistent__K1024__s0", "config": "random__persistent__K1024",
           "instance_id": "i", "policy": "random", "mode": "persistent", "budget": 1024.0, "seed": 0,
           "resolved": True, "exit_status": "submitted"}  # fmt: skip
    spec = RunSpec.from_record(old)
    assert spec == RunSpec("random", budget=1024, framework="topk-all") and spec.label == old["config"]
    assert {k: getattr(spec, k) for k in ("scope", "protect", "head_budget")} == {
        k: DEFAULTS[k] for k in ("scope", "protect", "head_budget")
    }
    assert spec.framework == "topk-all" != DEFAULTS["framework"]  # what ran then, not today's default
    assert spec.cache_config().framework == "topk-all"  # so a resumed old grid runs the old eviction
    # ... and today's record of the same configuration (another seed) is counted with it, ...
    new = {
        **old,
        **RunSpec("random", budget=1024, seed=1, framework="topk-all").record(),
        "run_id": "i__random__persistent__K1024__s1",
    }
    (row,) = summarize([old, new], n_boot=10)["configs"]
    assert row["label"] == "random__persistent__K1024" and row["seeds"] == [0, 1]
    # ... but a run of today's default framework is another configuration, with its own run id.
    rb = {**old, **RunSpec("random", budget=1024, seed=1).record(), "run_id": "i__x__s1"}
    rows = summarize([old, rb], n_boot=10)["configs"]
    assert sorted(r["label"] for r in rows) == [
        "random__persistent__K1024",
        "random__persistent__K1024__recent-buffer",
    ]
    assert EvalRun("i", RunSpec("random", budget=1024)).run_id != old["run_id"]
    assert EvalRun("i", RunSpec.from_record(old)).run_id == old["run_id"]
    # A record says what ran: one whose policy has left the registry since still reports.
    assert config_of({**old, "policy": "retired"}).label == "retired__persistent__K1024"


SCRIPT = textwrap.dedent(
    """
    import contextlib, dataclasses, json, sys, tempfile
    from pathlib import Path

    import kvagent.runtime.config as config

    @dataclasses.dataclass(frozen=True)
    class WithSinkTokens(config.CacheConfig):
        sink_tokens: int = 0  # the one line a new cache setting adds

    config.CacheConfig = WithSinkTokens  # as if it were declared in CacheConfig itself

    from kvagent.agent.config import AgentConfig
    from kvagent.bench.fidelity.tables import fidelity_rows
    from kvagent.evals.datasets import Instance
    from kvagent.evals.runner import EvalRun, EvalRunner, load_records
    from kvagent.evals.stats import summarize
    from kvagent.runspec import RunSpec, sweep
    from kvagent.runtime.models import load_qwen3_tokenizer
    from kvagent.testing import ScriptedEngine

    SUBMIT = "<function=finish>\\n<parameter=command>submit</parameter>\\n</function>"

    class Env:
        workdir = "/testbed"

        def run_tool(self, name, params, timeout=90):
            return {"output": "", "exit_code": 0}

        def diff(self):
            return ""

    specs = [s for b in (0, 32) for s in sweep(["random"], ["persistent"], [64], sink_tokens=b)]
    seen = []
    engine = ScriptedEngine(load_qwen3_tokenizer(), lambda c: seen.append(c.sink_tokens) or [SUBMIT])
    inst = Instance("i", "o/r", "HEAD", "fix it", "", [], [])
    run_dir = Path(tempfile.mkdtemp())
    runner = EvalRunner(run_dir=run_dir, engine=engine, instances={"i": inst},
                        open_env=lambda i: contextlib.nullcontext(Env()), agent_config=AgentConfig(max_steps=2))
    records = runner.run([EvalRun("i", s) for s in specs])
    old = {k: v for k, v in records[0].items() if k != "sink_tokens"}  # written before the field
    fid = [{**s.record(), "status": "ok", "kl": 0.0, "top1": 1.0, "logp_true": 0.0} for s in specs]
    json.dump({
        "labels": [s.label for s in specs],
        "sessions": seen,
        "recorded": [r.get("sink_tokens") for r in records],
        "record_labels": [r["config"] for r in records],
        "resumed": len(runner.pending([EvalRun("i", RunSpec.from_record(old))])),
        "report": sorted(c["label"] for c in summarize([old, *records], n_boot=10)["configs"]),
        "tables": sorted(r["policy"] for r in fidelity_rows(fid)),
    }, sys.stdout)
    """
)


def test_a_new_cache_field_reaches_the_session_label_record_and_report():
    """A field declared on CacheConfig alone (here on a copy) is swept, given to the session, recorded,
    labelled when it differs from its default, and grouped apart by the report and the tables."""
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["labels"] == [
        "random__persistent__K64__recent-buffer",
        "random__persistent__K64__recent-buffer__sink-tokens-32",
    ]
    assert got["sessions"] == [0, 32] and got["recorded"] == [0, 32]
    assert got["record_labels"] == got["labels"]
    assert got["resumed"] == 0  # an old record (no such field) is the default's run: not redone
    assert got["report"] == got["labels"]  # the old record joins the default's configuration
    assert got["tables"] == ["random", "random+32"]  # the framework is a column of its own


@pytest.mark.parametrize("value", [{"kernel": 5}, {}])
def test_specs_hash_without_their_policy_options(value):
    a, b = RunSpec("snapkv", budget=64, policy_args=value), RunSpec("snapkv", budget=64)
    assert hash(a) == hash(b) and (a == b) == (not value)
    assert len({a, b}) == (2 if value else 1)
