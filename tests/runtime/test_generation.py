"""Session.generate's reply options, each against the plain greedy reply on the same stream:
min_tokens holds off EOS and stop ids (and stop strings), ignore_eos samples through EOS, stop ids
end the reply like EOS, a stop string cuts the text before its first occurrence (or after it), a
per-call seed gives the same reply on the same stream whatever the session drew before, the reply
stops at the model's context, and the streamed text grows by prefixes to the final text."""

from __future__ import annotations

import torch

from kvagent.runtime import CacheConfig, Sampling
from kvagent.runtime.generation import Detokenizer, Stopping

PROMPT = torch.randint(0, 512, (12,), generator=torch.Generator().manual_seed(21)).tolist()


def fresh(engine):
    """A session at the end of PROMPT, whose last token is an append of its own (so it can be
    rewound and fed again)."""
    s = engine.session(CacheConfig())
    s.append(PROMPT[:-1])
    s.append(PROMPT[-1:])
    return s


def greedy(engine, n=10):
    return fresh(engine).generate(n)


def test_min_tokens_holds_off_eos_and_ignore_eos_samples_through_it(qwen3_engine, monkeypatch):
    plain = greedy(qwen3_engine)
    eos = plain.ids[2]
    monkeypatch.setattr(qwen3_engine, "eos_token_ids", {eos})
    g = fresh(qwen3_engine).generate(10)
    assert (g.finish_reason, g.stop, g.ids) == ("eos", eos, plain.ids[:3])
    assert g.text == qwen3_engine.tokenizer.decode(plain.ids[:2])  # the EOS left out
    late = fresh(qwen3_engine).generate(10, stopping=Stopping(min_tokens=6))
    assert len(late.ids) >= 6 and eos not in late.ids[:6], "EOS was sampled before min_tokens"
    assert late.ids[:2] == plain.ids[:2] and late.ids[2] != eos
    through = fresh(qwen3_engine).generate(10, stopping=Stopping(ignore_eos=True))
    assert (through.finish_reason, through.ids) == ("length", plain.ids)


def test_stop_token_ids_end_the_reply_and_min_tokens_masks_them(qwen3_engine):
    plain = greedy(qwen3_engine)
    stop_id = plain.ids[3]
    g = fresh(qwen3_engine).generate(10, stopping=Stopping(stop_token_ids=[stop_id]))
    assert (g.finish_reason, g.stop, g.ids) == ("stop", stop_id, plain.ids[:4])
    assert g.text == qwen3_engine.tokenizer.decode(plain.ids[:3])
    held = fresh(qwen3_engine).generate(10, stopping=Stopping(stop_token_ids=[stop_id], min_tokens=5))
    assert stop_id not in held.ids[:5] and len(held.ids) >= 5


def test_a_stop_string_cuts_the_text_before_its_first_occurrence(qwen3_engine):
    tok = qwen3_engine.tokenizer
    plain = greedy(qwen3_engine, 12)
    full = tok.decode(plain.ids)
    at = len(tok.decode(plain.ids[:5]).rstrip("\ufffd"))
    stop = full[at : at + 2]
    assert len(stop) == 2 and "\ufffd" not in stop, f"pick another prompt: {full!r}"
    first = full.find(stop)
    g = fresh(qwen3_engine).generate(12, stop=[stop])
    assert (g.finish_reason, g.stop, g.text) == ("stop", stop, full[:first])
    assert g.ids == plain.ids[: len(g.ids)] and len(g.ids) <= 6
    kept = fresh(qwen3_engine).generate(12, stopping=Stopping(stop=[stop], include_stop_str=True))
    assert kept.text == full[: first + len(stop)] and kept.ids == g.ids
    # held off by min_tokens: the occurrence before it does not count
    late = fresh(qwen3_engine).generate(12, stopping=Stopping(stop=[stop], min_tokens=len(g.ids) + 1))
    assert len(late.ids) > len(g.ids) and late.ids[: len(g.ids)] == g.ids


def test_streamed_text_grows_by_prefixes_to_the_final_text_and_never_shows_the_stop(qwen3_engine):
    tok = qwen3_engine.tokenizer
    plain = greedy(qwen3_engine, 12)
    full = tok.decode(plain.ids)
    # a stop across a token boundary: its first character is out one token before the stop is whole
    at = len(tok.decode(plain.ids[:7]))
    stop = full[at - 1 : at + 1]
    assert "\ufffd" not in stop and full.find(stop) == at - 1, f"pick another prompt: {full!r}"
    for stops in ([], [stop]):
        shown: list[str] = []
        g = fresh(qwen3_engine).generate(12, stop=stops, on_text=shown.append)
        assert shown and shown[-1] == g.text
        assert all(b.startswith(a) and len(b) > len(a) for a, b in zip(shown, shown[1:], strict=False))
        if stops:
            assert g.finish_reason == "stop" and g.text == full[: at - 1]
        else:
            assert g.text == full


def test_a_per_call_seed_gives_the_same_reply_whatever_the_session_drew_before(qwen3_engine):
    hot = Sampling(temperature=1.0, top_k=50)
    a = fresh(qwen3_engine).generate(10, hot, seed=3).ids
    b = fresh(qwen3_engine)
    b.generate(5, hot)  # the session's own generator moves on
    b.rewind(6)
    b.append(PROMPT[-1:])  # the same stream again
    assert b.generate(10, hot, seed=3).ids == a
    assert fresh(qwen3_engine).generate(10, hot, seed=4).ids != a
    # without a seed the session's generator continues: the same stream draws another reply
    d = fresh(qwen3_engine)
    first = d.generate(10, hot).ids
    d.rewind(11)
    d.append(PROMPT[-1:])
    assert d.generate(10, hot).ids != first


def test_the_reply_stops_at_the_models_context(qwen3_engine, monkeypatch):
    monkeypatch.setattr(qwen3_engine, "max_context", len(PROMPT) + 3)
    g = fresh(qwen3_engine).generate(10)
    assert (g.finish_reason, len(g.ids)) == ("length", 3)


def test_the_detokenizer_adds_up_to_the_whole_decode(qwen3_tokenizer):
    # rare characters come as several byte tokens each, so pieces end mid-character
    text = "héllo wörld: 𓀀𝔘𝔫𝔦 龘ꙮ 🦜 ok\n\tdef f(x):\n    return x  # ünïcode"
    ids = qwen3_tokenizer.encode(text, add_special_tokens=False)
    d = Detokenizer(qwen3_tokenizer)
    for i in ids:
        d.push(i)
        assert text.startswith(d.current), f"{d.current!r} is not a prefix of the text"
        assert "\ufffd" not in d.current
    assert d.flush() == text
