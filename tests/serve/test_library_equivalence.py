"""A server reply equals the library's reply for the same token stream, for every kind of request
option: greedy, seeded sampling (temperature, top-p, top-k), min_tokens with ignore_eos, stop strings
(cut, or kept with include_stop_str_in_output) and stop token ids. Each option set is a two-turn
conversation; the library side feeds the same prompts to one Session and calls Session.generate
with the options the request names."""

from __future__ import annotations

import pytest

from kvagent.runtime import CacheConfig, Sampling
from kvagent.runtime.generation import Stopping

from .conftest import MODEL, Replay, head_of, prompt_of

SYSTEM = {"role": "system", "content": "You are a careful coding agent."}
USERS = ["List the files in calc/.", "Now run the tests."]
FINISH = {"eos": "stop", "stop": "stop", "length": "length"}


def play(
    srv, engine, tokenizer, request: dict, sampling: Sampling, stopping: Stopping, seed=None, max_tokens=10
):
    """Both sides, turn by turn: (response, library generation) per turn."""
    replay = Replay(engine, CacheConfig())
    messages, out = [SYSTEM], []
    for text in USERS:
        messages.append({"role": "user", "content": text})
        prompt = prompt_of(tokenizer, messages)
        first = head_of(tokenizer, messages) if len(messages) == 2 else None
        g, _ = replay.turn(prompt, max_tokens, sampling, first=first, seed=seed, stopping=stopping)
        r = srv.client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=max_tokens, **request
        )
        out.append((r, g))
        messages.append({"role": "assistant", "content": r.choices[0].message.content})
    return out


def greedy_text(engine, tokenizer, n=10) -> tuple[str, list[int]]:
    """The library's greedy first reply (to pick stop strings and ids that occur in it)."""
    messages = [SYSTEM, {"role": "user", "content": USERS[0]}]
    g, _ = Replay(engine, CacheConfig()).turn(
        prompt_of(tokenizer, messages), n, first=head_of(tokenizer, messages)
    )
    return g.text, g.ids


CASES = {
    "greedy": ({"temperature": 0}, Sampling(), Stopping(), None),
    "seeded": ({"temperature": 0.9, "seed": 11}, Sampling(temperature=0.9), Stopping(), 11),
    "top_p+top_k": (
        {"temperature": 1.0, "top_p": 0.8, "seed": 5, "extra_body": {"top_k": 20}},
        Sampling(temperature=1.0, top_p=0.8, top_k=20),
        Stopping(),
        5,
    ),
    "min_tokens+ignore_eos": (
        {"temperature": 0.7, "seed": 2, "extra_body": {"min_tokens": 10, "ignore_eos": True}},
        Sampling(temperature=0.7),
        Stopping(min_tokens=10, ignore_eos=True),
        2,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_sampling_options_reply_as_the_library(serve, solo_engine, qwen3_tokenizer, case):
    request, sampling, stopping, seed = CASES[case]
    srv = serve(solo_engine)
    for i, (r, g) in enumerate(play(srv, solo_engine, qwen3_tokenizer, request, sampling, stopping, seed)):
        assert r.choices[0].message.content == g.text, (
            f"{case}, turn {i}: the reply differs from the library's"
        )
        assert r.usage.completion_tokens == len(g.ids)
        assert r.choices[0].finish_reason == FINISH[g.finish_reason]
        assert r.model_extra["kvagent"]["status"] == ("new" if i == 0 else "continued")


def test_stop_strings_and_stop_ids_reply_as_the_library(serve, solo_engine, qwen3_tokenizer):
    text, ids = greedy_text(solo_engine, qwen3_tokenizer)
    at = len(qwen3_tokenizer.decode(ids[:4]))
    stop = text[at - 1 : at + 1]
    assert len(stop) == 2 and "\ufffd" not in stop, f"pick another conversation: {text!r}"
    srv = serve(solo_engine)
    for include in (False, True):
        request = {"temperature": 0, "stop": [stop], "extra_body": {"include_stop_str_in_output": include}}
        turns = play(
            srv,
            solo_engine,
            qwen3_tokenizer,
            request,
            Sampling(),
            Stopping(stop=[stop], include_stop_str=include),
        )
        r, g = turns[0]
        assert g.finish_reason == "stop" and g.text.endswith(stop) == include  # the stop is really hit
        for i, (r, g) in enumerate(turns):
            assert r.choices[0].message.content == g.text, f"include={include}, turn {i}"
            assert (
                r.usage.completion_tokens == len(g.ids)
                and r.choices[0].finish_reason == FINISH[g.finish_reason]
            )
    stop_id = ids[3]
    request = {"temperature": 0, "extra_body": {"stop_token_ids": [stop_id]}}
    turns = play(srv, solo_engine, qwen3_tokenizer, request, Sampling(), Stopping(stop_token_ids=[stop_id]))
    assert turns[0][1].finish_reason == "stop" and turns[0][1].ids[-1] == stop_id
    for i, (r, g) in enumerate(turns):
        assert r.choices[0].message.content == g.text, f"stop_token_ids, turn {i}"
        assert (
            r.usage.completion_tokens == len(g.ids) and r.choices[0].finish_reason == FINISH[g.finish_reason]
        )
