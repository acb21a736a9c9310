"""A saved and loaded session continues exactly as the original: the same logits bit for bit (float32
CPU), the same kept positions, rounds, audit and sampled ids, for every registered policy, both
modes and both frameworks, saved mid-decode, one token before a round, after a rewind and after a
forget; in this process and in a fresh one. Files of another model, another version, cut short,
claiming absurd sizes or with a byte changed anywhere in their data are refused with one line."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from kvagent.errors import ConfigError
from kvagent.runtime import CacheConfig, Engine, Sampling, persist
from kvagent.runtime.heads import check_adaptive
from kvagent.runtime.policies import available, make_policy

VOCAB = 512
ARGS = {"nexus": {"block": 8}}  # its default block (32) would need a budget past this episode
TIMINGS = ("scoring_s", "compaction_s", "forward_s")


def config(policy: str, mode: str, framework: str, **kw) -> CacheConfig:
    args = ARGS.get(policy, {})
    block = make_policy(policy, **args).block
    k, r = block * -(-32 // block), block * -(-8 // block)
    return CacheConfig(
        policy=policy, budget=None if policy == "full" else k, buffer=r, mode=mode, framework=framework,
        protect="sink", seed=5, policy_args=args, audit=True, **kw,
    )  # fmt: skip


def episode(seed: int = 0) -> list[tuple[str, object]]:
    """About 200 tokens of an agent's calls: a prompt, sampled replies (the session's generator),
    observations, decode steps, a rewind, a forget, teacher forcing."""
    g = torch.Generator().manual_seed(seed)

    def ids(n):
        return torch.randint(0, VOCAB, (n,), generator=g).tolist()

    return [
        ("append", ids(24)),
        ("generate", 12),
        ("append", ids(30)),
        *[("step", t) for t in ids(40)],
        ("rewind", 15),
        ("append", ids(25)),
        ("generate", 10),
        ("forget", list(range(30, 40))),
        ("append", ids(20)),
        *[("step", t) for t in ids(40)],
        ("teacher_force", ids(12)),
        ("generate", 8),
    ]


def run(session, op) -> object:
    kind, arg = op
    if kind == "generate":
        gen = session.generate(arg, Sampling(temperature=1.0))
        return gen.ids, session.last_logits
    if kind == "append":
        return session.append(arg, all_logits=True)
    return getattr(session, kind)(arg)


def fingerprint(session) -> dict:
    """Everything observable that a continuation depends on, compared with torch.equal."""
    stats = {k: v for k, v in session.stats.to_dict().items() if k not in TIMINGS}
    ev = session.evictor
    return {
        "history": list(session.history),
        "kept": session.kept_positions(),
        "round_index": ev.round_index,
        "stats": stats,
        "audit": [(r.round, r.layer, r.logical_length, r.forced, r.kept) for r in session.audit or []],
    }


def assert_same(a, b, what: str) -> None:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor), what
        assert a.dtype == b.dtype and torch.equal(a, b), f"{what}: tensors differ"
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), what
        for k in a:
            assert_same(a[k], b[k], f"{what}.{k}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), f"{what}: lengths {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{what}[{i}]")
    else:
        assert a == b, f"{what}: {a!r} != {b!r}"


def save_points(session, ops, i: int, taken: dict) -> str | None:
    """The save point before op i, if this is one: mid-decode, one token before a round (the next
    token fed triggers one), right after the rewind, right after the forget."""
    kind, prev = ops[i][0], ops[i - 1][0] if i else None
    ev = session.evictor
    if prev in ("rewind", "forget"):
        return f"after-{prev}"
    due_next = session.config.evicts and ev.tokens_before_round(session.logical_length) == 1
    if kind == "step" and "before-round" not in taken and due_next:
        return "before-round"
    if kind == "step" and prev == "step" and "mid-decode" not in taken:
        return "mid-decode"
    return None


def check_continuations(engine, cfg: CacheConfig, tmp_path: Path, load_engine=None) -> dict[str, int]:
    """Run the episode once; at every save point save to a file, load into a new session (of
    `load_engine`, default the same engine) and run the rest of the episode on it. Every result
    and fingerprint must equal the original's. Returns the op index of each save point taken."""
    ops = episode()
    original = engine.session(cfg)
    forks: list[tuple[str, object]] = []
    taken: dict[str, int] = {}
    for i, op in enumerate(ops):
        point = save_points(original, ops, i, taken)
        if point and point not in taken:
            taken[point] = i
            path = tmp_path / f"{point}.kvs"
            original.save(path)
            fork = (load_engine or engine).load_session(path)
            assert_same(fingerprint(fork), fingerprint(original), f"{point}: just loaded")
            forks.append((point, fork))
        want = run(original, op)
        for point, fork in forks:
            assert_same(run(fork, op), want, f"{point}: op {i} {op[0]}")
            assert_same(fingerprint(fork), fingerprint(original), f"{point}: after op {i} {op[0]}")
    return taken


MATRIX = [
    (p, mode, fw)
    for p in available()
    for mode in ("persistent", "reprefill")
    for fw in ("recent-buffer", "topk-all")
]
# The whole matrix takes ~20 min on 2 busy cores; these cover per-entry state (h2o), window
# queries (snapkv), blocks (nexus) and reprefill in both frameworks.
FAST = {
    ("h2o", "persistent", "recent-buffer"),
    ("snapkv", "reprefill", "topk-all"),
    ("nexus", "persistent", "topk-all"),
}


@pytest.mark.parametrize(
    "policy,mode,framework",
    [pytest.param(*c, marks=() if c in FAST else pytest.mark.slow) for c in MATRIX],
)
def test_loaded_session_continues_exactly(tiny_engines, tmp_path, policy, mode, framework):
    cfg = config(policy, mode, framework)
    taken = check_continuations(tiny_engines["qwen3"], cfg, tmp_path)
    want = {"mid-decode", "after-rewind", "after-forget"} | ({"before-round"} if cfg.evicts else set())
    assert set(taken) == want, f"save points not reached: {want - set(taken)}"


@pytest.mark.parametrize(
    "policy,mode",
    [
        pytest.param(p, mode, marks=() if (p, mode) == ("h2o", "persistent") else pytest.mark.slow)
        for p in available()
        if check_adaptive(make_policy(p), p) is None
        for mode in ("persistent", "reprefill")
    ],
)
def test_adaptive_heads_continue_exactly(tiny_engines, tmp_path, policy, mode):
    """Ada-KV's per-head buffers (heads.HeadLayer) round-trip too, on the Llama model."""
    cfg = config(policy, mode, "recent-buffer", head_budget="adaptive")
    check_continuations(tiny_engines["llama"], cfg, tmp_path)


@pytest.mark.parametrize("mode", ["persistent", pytest.param("reprefill", marks=pytest.mark.slow)])
def test_batched_engine_sessions_continue_exactly(batch_engines, tiny_engines, tmp_path, mode):
    """A session in a pool slot (batching engine) is loaded into a slot again, and into a solo
    engine's private buffers of the same capacity: both continue exactly."""
    cfg = config("h2o", mode, "recent-buffer")
    check_continuations(batch_engines["qwen3"], cfg, tmp_path)
    check_continuations(batch_engines["qwen3"], cfg, tmp_path, load_engine=tiny_engines["qwen3"])


def test_the_check_can_fail(tiny_engines, tmp_path):
    """A restore that loses the policy state, the window queries or the sampling generator is
    caught: the comparison is not vacuous."""
    engine = tiny_engines["qwen3"]
    ops = episode()
    for cfg, lose in [
        (config("h2o", "persistent", "recent-buffer"), lambda m, t: m.update(state=[{"dict": {}}] * 2)),
        (config("snapkv", "persistent", "recent-buffer"), lambda m, t: m["cache"].update(window=[False] * 2)),
        (config("random", "persistent", "recent-buffer"), lambda m, t: t.pop("sample_gen")),
    ]:
        original = engine.session(cfg)
        for op in ops[:60]:
            run(original, op)
        state = persist.export_session(original).to_host()
        lose(state.meta, state.tensors)
        fork = persist.import_session(engine, state)
        with pytest.raises(AssertionError):
            for op in ops[60:]:
                assert_same(run(fork, op), run(original, op), f"{cfg.policy}: {op[0]}")


CHILD = """
import sys, torch
from kvagent.runtime import Engine
from kvagent.runtime.models import load_qwen3_tokenizer, tiny_random_model
from tests.runtime.test_persist import episode, run
torch.set_num_threads(int(sys.argv[1]))  # the parent's: a reduction split differently rounds differently
engine = Engine.load(tiny_random_model("qwen3", vocab_size=512, seed=1), tokenizer=load_qwen3_tokenizer(), device="cpu")
cut, out = int(sys.argv[2]), {}
for name in sys.argv[3:]:
    s = engine.load_session(name)
    out[name] = [run(s, op) for op in episode()[cut:]] + [s.kept_positions(), s.stats.rounds]
torch.save(out, sys.argv[3] + ".out")
"""


def test_a_fresh_process_continues_exactly(tiny_engines, tmp_path):
    engine, ops, cut = tiny_engines["qwen3"], episode(), 70  # mid-decode, after several rounds
    cfgs = [config("h2o", "persistent", "recent-buffer"), config("nexus", "reprefill", "topk-all")]
    sessions, names = [engine.session(c) for c in cfgs], []
    for i, s in enumerate(sessions):
        for op in ops[:cut]:
            run(s, op)
        assert s.stats.rounds > 2, "the saved session must have evicted"
        names.append(str(tmp_path / f"s{i}.kvs"))
        s.save(names[-1])
    root = Path(__file__).resolve().parents[2]
    argv = [sys.executable, "-c", textwrap.dedent(CHILD), str(torch.get_num_threads()), str(cut), *names]
    subprocess.run(argv, cwd=root, check=True, timeout=300)
    out = torch.load(names[0] + ".out")
    for name, s in zip(names, sessions, strict=True):
        want = [run(s, op) for op in ops[cut:]] + [s.kept_positions(), s.stats.rounds]
        assert_same(out[name], want, name)


# ----------------------------------------------------------------- refusals
@pytest.fixture
def saved(tiny_engines, tmp_path) -> Path:
    s = tiny_engines["qwen3"].session(config("h2o", "persistent", "recent-buffer"))
    for op in episode()[:50]:
        run(s, op)
    path = tmp_path / "s.kvs"
    s.save(path)
    return path


def refusal(engine, path) -> str:
    with pytest.raises(ConfigError) as e:
        engine.load_session(path)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg
    return msg


def rewrite(path: Path, edit) -> None:
    """The file with its header's JSON changed by `edit(header)` (tensors unchanged), its checksum
    sealed again: what is refused is the edit, not the checksum."""
    from safetensors.torch import load_file, save_file

    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(json.loads(f.read(n))["__metadata__"]["kvagent"])
    edit(header)
    tensors = load_file(path)
    header["checksum"] = persist.digest(tensors, header["state"])
    save_file(tensors, path, metadata={"kvagent": json.dumps(header)})


def test_another_models_file_is_refused(tiny_engines, saved):
    assert "saved from model" in refusal(tiny_engines["llama"], saved)
    # A copy: Engine.load converts a model's parameters in place, and the fixture's is shared.
    other = Engine.load(
        copy.deepcopy(tiny_engines["qwen3"].model),
        tokenizer=tiny_engines["qwen3"].tokenizer,
        dtype="bfloat16",
    )
    assert "dtype" in refusal(other, saved)


def test_a_cut_short_or_foreign_file_is_refused(tiny_engines, saved, tmp_path):
    engine, data = tiny_engines["qwen3"], saved.read_bytes()
    for size in (len(data) - 1, len(data) // 2, 100, 4, 0):
        saved.write_bytes(data[:size])
        assert "cut short" in refusal(engine, saved)
    (tmp_path / "x.json").write_text("{}")
    assert "not a kvagent session file" in refusal(engine, tmp_path / "x.json")
    assert "not found" in refusal(engine, tmp_path / "missing.kvs")


def test_another_version_is_refused(tiny_engines, saved):
    rewrite(saved, lambda h: h.update(version=persist.VERSION + 1))
    assert f"format version {persist.VERSION + 1}" in refusal(tiny_engines["qwen3"], saved)


def test_absurd_sizes_are_refused_before_allocating(tiny_engines, saved):
    rewrite(saved, lambda h: h["state"]["cache"]["layers"][0].update(capacity=10**12))
    assert "damaged" in refusal(tiny_engines["qwen3"], saved)


def test_a_byte_changed_in_the_data_is_refused(tiny_engines, saved):
    """Silent damage, the size intact: a flipped byte in any tensor (a key, the history, the last
    logits) or in the state is refused by the checksum; the file as written loads."""
    engine, data = tiny_engines["qwen3"], saved.read_bytes()
    n = int.from_bytes(data[:8], "little")
    entries = json.loads(data[8 : 8 + n])
    engine.load_session(saved)
    for name in ("cache.layers.0.keys", "history", "last_logits"):
        start, end = entries[name]["data_offsets"]
        damaged = bytearray(data)
        damaged[8 + n + (start + end) // 2] ^= 0x10
        saved.write_bytes(bytes(damaged))
        assert "does not match the checksum" in refusal(engine, saved), name
    raw = bytearray(data)  # a digit of the state's round counter changed, the header's length kept
    i = data.index(b"round_index", 8)
    j = i + data[i:].index(b",") - 1
    raw[j] = ord(str((int(chr(raw[j])) + 1) % 10))
    saved.write_bytes(bytes(raw))
    assert "does not match the checksum" in refusal(engine, saved)


def test_segment_marks_are_part_of_a_session(tiny_engines):
    """The segments policy keeps or evicts the spans Session.mark_segment named: a restored session
    carries the marks, so it keeps the same spans as the original; without them it would not."""
    engine = tiny_engines["qwen3"]
    cfg = config("segments", "persistent", "recent-buffer")
    ops = episode()
    original = engine.session(cfg)
    for op in ops[:60]:
        if op[0] in ("append", "generate"):
            original.mark_segment(original.logical_length)
        run(original, op)
    state = persist.export_session(original).to_host()
    assert state.meta["segments"] == original.evictor.segments and len(state.meta["segments"]) >= 3
    fork = persist.import_session(engine, state)
    assert fork.evictor.segments == original.evictor.segments
    for i, op in enumerate(ops[60:]):
        for s in (original, fork):
            if op[0] in ("append", "generate"):
                s.mark_segment(s.logical_length)
        assert_same(run(fork, op), run(original, op), f"segments: op {60 + i} {op[0]}")
    assert_same(fingerprint(fork), fingerprint(original), "segments: after the episode")
