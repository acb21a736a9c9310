"""`kvagent bench serve`: the workload cut into turns (recorded replies carried on), /metrics read for
KV figures, the summary's arithmetic, and the whole command against a real `kvagent serve` process on
the tiny model (two conversations, two turns, measured twice under two labels): every figure present
and positive, both runs seeing the same token streams."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import pytest

from kvagent.bench.episodes import Episode
from kvagent.bench.serve_load.metrics import kv_state, kv_summary, parse_prometheus
from kvagent.bench.serve_load.report import summarize
from kvagent.bench.serve_load.run import Target
from kvagent.bench.serve_load.workload import Limits, build_workload, conversation_of
from kvagent.cli.app import app
from kvagent.cli.exits import run_app
from kvagent.errors import ConfigError


def _episode(name: str, replies: int, obs: str = "output of the command", words: int = 0) -> Episode:
    msgs = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": f"Fix bug {name}."},
    ]
    for i in range(replies):
        msgs.append({"role": "assistant", "content": f"step {i} " * (words // 2 or i + 2)})
        msgs.append({"role": "tool", "content": f"{obs} {i}"})
    return Episode(name=name, messages=msgs)


def _count_words(messages) -> int:
    return sum(len(m["content"].split()) + 2 for m in messages) + 1


def _words(text: str) -> int:
    return len(text.split())


# ------------------------------------------------------------------------------------- workload
def test_turns_carry_the_recorded_replies_and_send_observations_as_user():
    conv = conversation_of(_episode("a", 3), _count_words, _words, Limits(max_turns=8, max_context=10_000))
    assert len(conv.turns) == 3
    t2 = conv.turns[2]
    # turn 2's history holds the two earlier recorded replies, verbatim, and their observations as user
    assert [m["role"] for m in t2.messages] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert t2.messages[2]["content"] == "step 0 step 0 " and t2.messages[4]["content"] == "step 1 " * 3
    assert [t.max_tokens for t in conv.turns] == [4, 6, 8]  # each recorded reply's length
    assert t2.prompt_tokens == _count_words(t2.messages)
    assert conv.final_length == t2.prompt_tokens + 8


def test_a_run_tag_opens_every_turn_and_changes_nothing_else():
    ep = _episode("a", 2)
    plain = conversation_of(ep, _count_words, _words, Limits())
    tagged = conversation_of(ep, _count_words, _words, Limits(), tag="[run 1234]")
    for p, t in zip(plain.turns, tagged.turns, strict=True):
        assert t.messages[0]["content"] == "[run 1234]\n" + p.messages[0]["content"]
        assert t.messages[1:] == p.messages[1:] and t.max_tokens == p.max_tokens
    assert ep.messages[0]["content"] == "You are an agent."  # the episode itself is untouched


def test_limits_cut_turns_replies_and_context():
    ep = _episode("a", 5)
    assert len(conversation_of(ep, _count_words, _words, Limits(max_turns=2)).turns) == 2
    capped = conversation_of(ep, _count_words, _words, Limits(max_reply=5, max_context=10_000))
    assert [t.max_tokens for t in capped.turns] == [4, 5, 5, 5, 5]
    full = conversation_of(ep, _count_words, _words, Limits(max_context=10_000))
    t3 = full.turns[3]
    # turn 3's prompt fits, its reply does not: the conversation ends after turn 2
    cut = conversation_of(ep, _count_words, _words, Limits(max_context=t3.prompt_tokens + t3.max_tokens - 1))
    assert len(cut.turns) == 3
    exact = conversation_of(ep, _count_words, _words, Limits(max_context=t3.prompt_tokens + t3.max_tokens))
    assert len(exact.turns) == 4


def test_too_few_usable_episodes_is_one_line():
    eps = [_episode("a", 2), _episode("b", 2)]
    assert [c.name for c in build_workload(eps, _count_words, _words, Limits(), 2)] == ["a", "b"]
    with pytest.raises(ConfigError, match="3 asked for, 2 episodes usable"):
        build_workload(eps, _count_words, _words, Limits(), 3)
    with pytest.raises(ConfigError, match="had no turn within --max-context 5"):
        build_workload(eps, _count_words, _words, Limits(max_context=5), 1)


def test_url_forms():
    assert Target.parse("http://127.0.0.1:8000/v1/") == Target("http://127.0.0.1:8000")
    assert Target.parse("vllm=http://h:1") == Target("http://h:1", "vllm")
    with pytest.raises(ConfigError, match="not http"):
        Target.parse("127.0.0.1:8000")


# ------------------------------------------------------------------------------------- /metrics
KVAGENT_METRICS = """# HELP kvagent_kv_bytes KV
# TYPE kvagent_kv_bytes gauge
kvagent_kv_bytes 1048576.0
kvagent_kv_memory_limit_bytes 4194304.0
kvagent_live_sessions 3.0
kvagent_sessions_dropped_total{reason="kv_memory"} 2.0
kvagent_sessions_dropped_total{reason="max_sessions"} 1.0
kvagent_evicted_entries_total 500.0
kvagent_time_to_first_token_seconds_bucket{le="0.1"} 4.0
"""
VLLM_METRICS = """vllm:kv_cache_usage_perc{engine="0",model_name="smollm2"} 0.25
vllm:num_preemptions_total{engine="0",model_name="smollm2"} 7.0
vllm:prefix_cache_queries_total{engine="0",model_name="smollm2"} 100.0
vllm:prefix_cache_hits_total{engine="0",model_name="smollm2"} 80.0
vllm:cache_config_info{block_size="128",engine="0",num_gpu_blocks="64"} 1.0
vllm:num_requests_waiting{engine="0",model_name="smollm2"} 3.0
"""


def test_kv_state_reads_both_servers():
    k = kv_state(parse_prometheus(KVAGENT_METRICS))
    assert k["engine"] == "kvagent" and k["kv_usage"] == 0.25 and k["dropped_sessions"] == 3
    assert k["evicted_entries"] == 500 and k["live_sessions"] == 3
    v = kv_state(parse_prometheus(VLLM_METRICS))
    assert v["engine"] == "vllm" and v["kv_usage"] == 0.25 and v["preemptions"] == 7
    assert v["kv_capacity_tokens"] == 64 * 128 and v["waiting"] == 3 and v["prefix_cache_hits"] == 80
    later = {**v, "preemptions": 10.0, "kv_usage": 0.1}
    s = kv_summary(v, later, {"kv_usage": 0.9})
    assert s["preemptions"] == 3 and s["peak_kv_usage"] == 0.9 and "kv_usage" not in s


# ------------------------------------------------------------------------------------- summary
def _rec(conv, turn, start, ttft, dur, n, prompt, cached, ok=True):
    return {"conversation": conv, "turn": turn, "start": start, "end": start + dur, "ttft_s": ttft,
            "duration_s": dur, "completion_tokens": n, "prompt_tokens": prompt, "cached_tokens": cached,
            "ok": ok, "error": None if ok else "HTTP 500: boom", "expected_tokens": n}  # fmt: skip


def test_summary_figures():
    recs = [_rec("a", 0, 0.0, 1.0, 3.0, 21, 100, 0), _rec("a", 1, 3.0, 0.5, 2.5, 21, 150, 120),
            _rec("b", 0, 0.0, 2.0, 4.0, 11, 80, 0), _rec("b", 1, 4.0, 0.0, 1.0, 0, 0, None, ok=False)]  # fmt: skip
    s = summarize({"url": "u", "label": "x", "wall_s": 6.0, "records": recs, "kv": {}})
    assert s["output_tokens"] == 53 and s["output_tok_s"] == pytest.approx(53 / 6)
    assert s["errors"] == 1 and s["first_error"] == "HTTP 500: boom"
    assert s["ttft_p50_s"] == pytest.approx(1.0) and s["ttft_max_s"] == 2.0
    assert s["episode_wall_mean_s"] == pytest.approx((5.5 + 5.0) / 2) and s["episode_wall_max_s"] == 5.5
    assert s["prompt_tokens_sent"] == 330 and s["prompt_tokens_continued"] == 120
    assert [p["n"] for p in s["per_turn"]] == [2, 1]
    assert s["per_turn"][1]["decode_tok_s_p50"] == pytest.approx(20 / 2.0)  # (21 - 1) / (2.5 - 0.5)


# ------------------------------------------------------------------------------------- the command
@pytest.mark.parametrize(
    ("args", "words"),
    [
        ([], "url: none given"),
        (["--url", "localhost:8000"], "is not http(s)://HOST:PORT"),
        (["--url", "http://127.0.0.1:9", "--concurrency", "0"], "concurrency: must be >= 1"),
        (["--url", "http://127.0.0.1:9", "--turns", "0"], "turns: must be >= 1"),
        (["--url", "http://127.0.0.1:9", "--max-reply", "0"], "max-reply: must be >= 1"),
        (["--url", "http://127.0.0.1:9", "--timeout", "0"], "timeout: must be > 0"),
    ],
)
def test_bad_options_are_one_line(args, words, tmp_path, capsys):
    code = run_app(app, ["bench", "serve", *args, "--out", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and words in err[0], err
    assert not (tmp_path / "o").exists()


def test_unreachable_url_is_one_line(tmp_path, capsys):
    eps = tmp_path / "eps.jsonl"
    eps.write_text(json.dumps({"id": "a", "messages": _episode("a", 2).messages}) + "\n")
    code = run_app(app, ["bench", "serve", "--url", "http://127.0.0.1:9", "--episodes", f"{eps}:plant=0",
                         "--tokenizer", "tiny-random-qwen3", "--concurrency", "1", "--out", str(tmp_path / "o"),
                         "--quiet"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "start the server or fix --url" in err[0], err


@pytest.fixture(scope="module")
def kvagent_serve():
    """A real `kvagent serve` process on the tiny model, on a free port."""
    cmd = [sys.executable, "-m", "kvagent", "serve", "--model", "tiny-random-qwen3", "--port", "0",
           "--max-batch", "2", "--log-level", "warning", "--device", "cpu"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline()
        assert "at http://127.0.0.1:" in line, line + proc.stdout.read()
        url = line.split("at ", 1)[1].split("/v1", 1)[0]
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{url}/health", timeout=5).raise_for_status()
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the server never answered"
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_bench_serve_against_kvagent_serve(kvagent_serve, tmp_path, capsys):
    eps = tmp_path / "eps.jsonl"
    with eps.open("w") as f:
        for name in ("alpha", "beta"):
            f.write(
                json.dumps({"id": name, "messages": _episode(name, 3, obs=f"{name} says").messages}) + "\n"
            )
    out = tmp_path / "out"
    code = run_app(app, ["bench", "serve", "--url", f"one={kvagent_serve}", "--url", f"two={kvagent_serve}",
                         "--episodes", f"{eps}:plant=0", "--tokenizer", "tiny-random-qwen3", "--concurrency", "2",
                         "--turns", "2", "--max-reply", "12", "--out", str(out), "--quiet"])  # fmt: skip
    printed = capsys.readouterr().out
    assert code == 0, printed
    rep = json.loads((out / "serve.json").read_text())
    assert rep["workload"]["conversations"] == 2 and rep["workload"]["turns"] == 4
    assert [s["label"] for s in rep["servers"]] == ["one", "two"]
    assert rep["streams"] == {"compared": 4, "equal": 4}  # both runs sent the same token streams
    for s in rep["servers"]:
        assert s["turns"] == 4 and s["errors"] == 0 and s["short"] == 0, s["first_error"]
        assert s["output_tokens"] == rep["workload"]["reply_tokens"]
        for key in ("output_tok_s", "ttft_p50_s", "ttft_p95_s", "episode_wall_mean_s", "episode_wall_max_s",
                    "decode_tok_s_p50", "prompt_tokens_sent", "prompt_tokens_continued", "wall_s"):  # fmt: skip
            assert s[key] is not None and s[key] > 0, (key, s[key])
        assert s["prompt_tokens_continued"] < s["prompt_tokens_sent"]
        assert s["kv"]["engine"] == "kvagent" and s["kv"]["peak_kv_bytes"] > 0
        assert [p["turn"] for p in s["per_turn"]] == [0, 1]
        assert all(p["n"] == 2 and p["ttft_p50_s"] > 0 and p["decode_tok_s_p50"] > 0 for p in s["per_turn"])
    assert rep["servers"][1]["output_tok_s_vs_first"] > 0
    assert (out / "serve.png").stat().st_size > 10_000
    md = (out / "serve.md").read_text()
    assert "| one |" in md and "| two |" in md and "4 of 4 turns" in md
    assert "| one |" in printed


def test_metrics_are_sampled_while_the_load_runs(kvagent_serve):
    from kvagent.bench.serve_load.run import LoadSettings, run_load

    # Replies of 160 tokens keep each turn running for a good part of a second on the tiny model:
    # with 4-token replies a turn could end between two scrapes on a loaded machine (seen in CI).
    eps = [_episode("g", 2, words=160), _episode("h", 2, words=160)]
    convs = build_workload(eps, _count_words, _words, Limits(max_reply=160), 2)
    assert all(t.max_tokens >= 150 for c in convs for t in c.turns)
    (res,) = run_load([Target(kvagent_serve)], convs, LoadSettings(concurrency=2, scrape_every_s=0.01))
    assert len(res["records"]) == 4 and all(r["ok"] for r in res["records"])
    # running is 0 before and after the load: a peak of 1+ was seen by the sampler during it
    assert res["kv"]["peak_running"] >= 1 and res["kv"]["peak_live_sessions"] >= 2
