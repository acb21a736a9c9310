"""history=r2egym (the default of --scaffold r2egym) on a real session (tiny-random-qwen3): each
answered reply is taken back with Session.rewind and R2E-Gym's rendering of it appended, so the token
stream the model reads before its last reply is the one R2E-Gym would send: its messages (thought +
re-serialised call per turn) through the Qwen3 chat template, tokenised whole, and a fresh prefill of
those tokens gives the same logits. Positions stay contiguous; the trajectory keeps every reply
verbatim. Replies cover a <think> block with prose, a reply without <think> (its blank line merges
with the turn opening's newline), a reply without a call, and the finish."""

from __future__ import annotations

import re

import pytest
import torch

from kvagent.agent import AgentConfig, ChatMLRenderer, run_episode
from kvagent.runtime import CacheConfig, Engine
from kvagent.runtime.oracle import check_session_against_oracle, trace
from kvagent.testing import Generated

from .test_r2egym_profile import Env

REPLIES = [
    "<think>\nFirst look around.\n</think>\nSome prose the history drops.\n"
    "<function=execute_bash>\n<parameter=cmd>  ls -la  </parameter>\n</function>\nafter the call",
    "No thinking this time.\n<function=file_editor><parameter=command>view</parameter>"
    "<parameter=path>/testbed/x.py</parameter></function>",
    "<think>I forgot the call</think> so this reply has none.",
    "<think>\nDone.\n</think>\n\n<function=finish>\n<parameter=command>submit</parameter>\n</function>",
]


class ForcedSession:
    """A real Session whose replies are fixed text, teacher-forced as if sampled; keeps the logits
    of each append (what the next reply is sampled from)."""

    def __init__(self, session, tokenizer, replies):
        self.session, self.tokenizer, self.replies = session, tokenizer, list(replies)
        self.logits, self.starts = [], []

    def __getattr__(self, name):
        return getattr(self.session, name)

    def append(self, ids):
        out = self.session.append(ids)
        self.logits.append(out)
        return out

    def generate(self, max_new_tokens, sampling=None, stop=(), on_token=None):
        self.starts.append(self.session.logical_length)
        ids = self.tokenizer.encode(self.replies.pop(0), add_special_tokens=False)
        ids = [*ids, self.tokenizer.convert_tokens_to_ids("<|im_end|>")][:max_new_tokens]
        self.session.teacher_force(ids)
        return Generated(ids, self.tokenizer.decode(ids), "eos")


def r2egym_messages(result):
    """R2E-Gym's conversation for the last call, built as its agent builds it: the prompt, then per
    answered reply `thought + blank line + call re-serialised` and the observation (each user
    message with its step line); the thought is the first <think> block, the call its first block."""

    def serialise(reply):
        block = re.search(r"(?s)<function=.*?</function>", reply)
        name, params = "", {}
        if block:
            name = re.search(r"<function\s*=\s*([^>]+)>", block.group(0)).group(1).strip()
            for k, v in re.findall(r"(?s)<parameter\s*=\s*([^>]+)>(.*?)</parameter>", block.group(0)):
                params[k.strip()] = v.strip()
        body = "".join(f"  <parameter={k}>{v}</parameter>\n" for k, v in params.items())
        return f"<function={name}>\n{body}</function>"

    messages = result.messages[:2]
    for turn in result.turns[:-1]:
        thought = re.search(r"(?s)<think>.*?</think>", turn.reply)
        thought = thought.group(0).strip() if thought else ""
        messages += [
            {"role": "assistant", "content": f"{thought}\n\n{serialise(turn.reply)}"},
            {"role": "user", "content": turn.observation},
        ]
    return messages


@pytest.fixture(scope="module")
def tiny():
    return Engine.load("tiny-random-qwen3", device="cpu")


@pytest.fixture
def prompts(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text("system_prompt: You fix bugs.\ninstance_prompt: 'Fix: {problem_statement}'\n")
    return str(p)


def episode(tiny, cache, prompts):
    session = tiny.session(cache)
    forced = ForcedSession(session, tiny.tokenizer, REPLIES)
    config = AgentConfig(scaffold="r2egym", prompts=prompts)  # history: the scaffold's (r2egym)
    assert config.history == "r2egym"
    with trace(session) as records:
        result = run_episode(forced, Env(), "x.py crashes", config, tokenizer=tiny.tokenizer)
    assert result.exit_status == "submitted", result.error
    return session, forced, records, result


@pytest.mark.parametrize("mode", ["persistent", "reprefill"])
def test_stream_equals_r2egyms_rendering(tiny, prompts, mode):
    session, forced, _, result = episode(tiny, CacheConfig(mode=mode), prompts)
    rendered = tiny.tokenizer.apply_chat_template(
        r2egym_messages(result), tokenize=False, add_generation_prompt=True
    )
    expected = tiny.tokenizer.encode(rendered, add_special_tokens=False)
    last = forced.starts[-1]  # the stream the last reply was sampled from
    assert session.history[:last] == expected
    assert tiny.tokenizer.decode(session.history[:last]) == rendered
    assert session.logical_length == len(session.history)  # no gap: positions contiguous
    assert ChatMLRenderer.transcript(result.messages) == tiny.tokenizer.decode(session.history)
    assert [t.reply for t in result.turns] == [
        tiny.tokenizer.decode(tiny.tokenizer.encode(r, add_special_tokens=False)) + "<|im_end|>"
        for r in REPLIES
    ]  # the trajectory keeps each reply verbatim
    assert all(t.rewound > 0 for t in result.turns[:-1])
    # the reply without <think> keeps R2E-Gym's blank line, tokenised with the turn's opening
    assert result.messages[4]["content"].startswith("\n\n<function=file_editor>")


def test_persistent_logits_equal_a_prefill_of_r2egyms_tokens(tiny, prompts):
    session, forced, _, result = episode(tiny, CacheConfig(), prompts)
    rendered = tiny.tokenizer.apply_chat_template(
        r2egym_messages(result), tokenize=False, add_generation_prompt=True
    )
    fresh = tiny.session(CacheConfig())
    logits = fresh.append(tiny.tokenizer.encode(rendered, add_special_tokens=False))
    assert torch.allclose(forced.logits[-1], logits, atol=1e-4)


def test_evicting_session_stays_exact_under_rewinds(tiny, prompts):
    cache = CacheConfig(policy="random", budget=96, buffer=16, protect="sink", seed=2)
    session, _, records, result = episode(tiny, cache, prompts)
    assert result.turns[0].rewound > 0
    assert check_session_against_oracle(session, records) < 1e-4


def test_chat_follow_up_re_renders_the_last_reply(tokenizer):
    """Chat under R2E-Gym's protocol: the reply that ended a request is re-rendered when the next
    request arrives, as an observation would re-render it."""
    from kvagent.agent.chat import ChatAgent
    from kvagent.testing import ScriptedSession
    from tests.helpers import SUBMIT

    session = ScriptedSession(tokenizer, ["<think>a</think>" + SUBMIT, SUBMIT])
    chat = ChatAgent(session, Env(), tokenizer, AgentConfig(scaffold="r2egym"))
    assert chat.ask("first") == "submitted" and chat.ask("second") == "submitted"
    assert len(session.rewound) == 1 and chat.turns[0].rewound == session.rewound[0]
    assert chat.messages[2]["content"].startswith(
        "<function=finish>\n  <parameter=command>submit</parameter>"
    )
    assert ChatMLRenderer.transcript(chat.messages) == tokenizer.decode(session.history)
