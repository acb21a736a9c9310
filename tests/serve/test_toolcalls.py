"""Tool calling for the Qwen family: tools and earlier calls rendered by the model's own chat template
(Hermes-folded into the turns for templates without tool support), `<tool_call>{json}</tool_call>`
in a reply parsed into OpenAI tool_calls, and R2E-Gym's text-format calls left as content."""

from __future__ import annotations

import json

from kvagent.runtime import Generation
from kvagent.serve import toolcalls
from kvagent.serve.protocol import GenRequest
from kvagent.serve.render import chat_text, takes_tools
from kvagent.serve.responses import Chunks
from kvagent.serve.runner import Outcome

from .conftest import MODEL, prompt_of

BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}
REPLY = 'Let me look.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>'


def test_hermes_calls_are_parsed_and_the_rest_is_content():
    p = toolcalls.parse(REPLY)
    assert p.content == "Let me look."
    assert [
        (c["type"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in p.tool_calls
    ] == [("function", "bash", {"command": "ls -la"})]
    two = toolcalls.parse(
        REPLY + '\n<tool_call>{"name": "bash", "arguments": "{\\"command\\": \\"pwd\\"}"}</tool_call>'
    )
    assert [json.loads(c["function"]["arguments"])["command"] for c in two.tool_calls] == ["ls -la", "pwd"]
    assert toolcalls.parse('<tool_call>{"name": "bash", "arguments": {}}</tool_call>').content is None


def test_what_is_not_a_call_stays_content():
    r2egym = "I'll check.\n<function=execute_bash>\n<parameter=cmd>ls</parameter>\n</function>"
    broken = "<tool_call>{not json}</tool_call>"
    unclosed = 'Trying <tool_call>{"name": "bash", "arguments": {'
    for text in (r2egym, broken, unclosed, "plain answer"):
        p = toolcalls.parse(text)
        assert p.content == text and p.tool_calls == []


def test_streamed_tool_reply_adds_up_to_the_parsed_one():
    chunks = Chunks("chat", MODEL, tools_on=True, include_usage=False)
    pieces = [chunks.grow(REPLY[:i]) for i in range(1, len(REPLY) + 1)]
    streamed = [json.loads(p[6:])["choices"][0]["delta"].get("content") for p in pieces if p]
    assert "<" not in "".join(streamed), "text of the call was shown as content"
    outcome = Outcome(None, Generation([1], REPLY, "stop"), {}, {"session": "s1"}, {})  # type: ignore[arg-type]
    tail = [json.loads(p[6:]) for p in chunks.end(outcome)]
    content = "".join(streamed) + "".join(t["choices"][0]["delta"].get("content") or "" for t in tail)
    assert content == toolcalls.parse(REPLY).content
    calls = [d for t in tail for d in t["choices"][0]["delta"].get("tool_calls", [])]
    assert calls[0]["function"]["name"] == "bash" and calls[0]["index"] == 0
    assert tail[-1]["choices"][0]["finish_reason"] == "tool_calls"


def conversation_with_a_call():
    return [
        {"role": "system", "content": "You fix bugs."},
        {"role": "user", "content": "What is here?"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "calc.py"},
    ]  # fmt: skip


def test_qwen3_template_renders_tools_and_calls(qwen3_tokenizer):
    from kvagent.serve.messages import check_messages

    assert takes_tools(qwen3_tokenizer)
    req = GenRequest("chat", MODEL, messages=check_messages(conversation_with_a_call()), tools=[BASH])
    text = chat_text(qwen3_tokenizer, req)
    assert '"name": "bash"' in text and "<tools>" in text
    assert '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>' in text
    assert "<tool_response>\ncalc.py\n</tool_response>" in text
    assert "<tools>" not in chat_text(qwen3_tokenizer, GenRequest("chat", MODEL, messages=req.messages, tools=[BASH],
                                                                  tool_choice="none"))  # fmt: skip


class ChatmlOnly:
    """A tokenizer whose template knows roles and string content only (as SmolLM2's)."""

    chat_template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"

    def apply_chat_template(self, messages, tools=None, add_generation_prompt=True, tokenize=False):
        assert tools is None and all(isinstance(m["content"], str) for m in messages)
        body = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return body + "<|im_start|>assistant\n"


def test_a_template_without_tools_gets_them_folded_in_hermes_form():
    from kvagent.serve.messages import check_messages

    assert not takes_tools(ChatmlOnly())
    req = GenRequest("chat", MODEL, messages=check_messages(conversation_with_a_call()), tools=[BASH])
    text = chat_text(ChatmlOnly(), req)
    system = text.split("<|im_end|>")[0]
    assert "You fix bugs." in system and '"name": "bash"' in system and "<tool_call>" in system
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
        in text
    )
    assert "<|im_start|>user\n<tool_response>\ncalc.py\n</tool_response>" in text


def test_served_tools_reach_the_prompt(serve, solo_engine, qwen3_tokenizer):
    from kvagent.serve.messages import check_messages

    srv = serve(solo_engine)
    messages = conversation_with_a_call()
    r = srv.client.chat.completions.create(
        model=MODEL, messages=messages, tools=[BASH], max_tokens=4, temperature=0
    )
    normalised = check_messages(messages)  # the null content of the calling turn made ""
    with_tools = prompt_of(qwen3_tokenizer, normalised, tools=[BASH])
    assert r.usage.prompt_tokens == len(with_tools) > len(prompt_of(qwen3_tokenizer, normalised))
    assert r.choices[0].finish_reason in ("length", "stop", "tool_calls")
