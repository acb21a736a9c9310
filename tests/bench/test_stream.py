from kvagent.agent.render import ChatMLRenderer
from kvagent.bench.episodes import Episode, default_probe
from kvagent.bench.stream import build_stream


def _agent_messages():
    return [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "issue"},
        {"role": "assistant", "content": "look\n<function=finish>\n</function>"},
        {"role": "user", "content": "obs 1"},
        {"role": "assistant", "content": "again"},
        {"role": "user", "content": "obs 2"},
    ]


def test_stream_text_is_the_agents_transcript(qwen3_tokenizer):
    msgs = _agent_messages()
    s = build_stream(Episode("e", msgs), qwen3_tokenizer)
    text = qwen3_tokenizer.decode(s.ids, skip_special_tokens=False)
    # A trailing observation is not followed by an opened assistant turn: nothing is replied there.
    assert text == ChatMLRenderer.transcript(msgs).removesuffix("<|im_start|>assistant\n")
    assert [seg.kind for seg in s.segments] == ["append", "step", "append", "step", "append"]
    assert s.segments[0].ids == tuple(ChatMLRenderer(qwen3_tokenizer).prompt_ids("sys", "issue"))
    im_end = qwen3_tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert all(seg.ids[-1] == im_end for seg in s.segments if seg.kind == "step")


def test_probe_and_max_tokens(qwen3_tokenizer):
    ep = Episode("e", _agent_messages(), probe=default_probe())
    s = build_stream(ep, qwen3_tokenizer)
    assert s.probe is not None and qwen3_tokenizer.decode(s.probe.value).strip() == "7319-AXQ"
    assert "deploy key" in qwen3_tokenizer.decode(s.probe.question)
    cut = build_stream(ep, qwen3_tokenizer, max_tokens=s.prompt_length + 12)
    assert cut.n_turns == 1 and cut.digest() != s.digest()
