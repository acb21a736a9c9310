"""The batcher's choice of a forward's chunks (`batcher.pick`): the token cap, max_batch and
the prefill budget."""

from __future__ import annotations

import pytest

from kvagent.errors import ConfigError
from kvagent.runtime.batcher import pick


def _sizes(sizes: list[int], **kw) -> list[int]:
    """The token counts of the chunks the next forward takes, oldest first."""
    args = dict(max_batch=8, max_tokens=4096, prefill_budget=512) | kw
    return [sizes[i] for i in pick(sizes, **args)]


def test_with_decode_tokens_waiting_a_forward_takes_prefill_only_up_to_the_budget():
    # Oldest first: two 512-token prompt chunks and three decode tokens; one chunk rides along.
    assert pick([512, 1, 512, 1, 1], 8, 4096, 512) == [0, 1, 3, 4]
    # Smaller chunks fill the budget together; the one that would pass it waits.
    assert _sizes([200, 1, 300, 100, 1]) == [200, 1, 300, 1]


def test_a_prefill_chunk_over_the_budget_still_runs_so_prompts_never_starve():
    assert _sizes([1, 1, 512, 512], prefill_budget=64) == [1, 1, 512]


def test_without_decode_tokens_prefill_is_bounded_by_the_token_cap_alone():
    assert _sizes([512, 512, 512, 512], max_tokens=1500) == [512, 512]


def test_no_budget_takes_chunks_as_the_token_cap_allows():
    assert _sizes([512, 1, 512, 1], prefill_budget=None) == [512, 1, 512, 1]


def test_a_chunk_over_the_token_cap_waits_while_later_decode_tokens_go():
    assert _sizes([512, 512, 1, 1, 1], max_batch=3, max_tokens=600, prefill_budget=None) == [512, 1, 1]
    # The oldest chunk always goes, whatever its size.
    assert _sizes([900, 1], max_tokens=600, prefill_budget=None) == [900]


def test_a_budgeted_engine_serves_prompts_beside_decoding_sessions_as_a_solo_run_does(tiny_engines):
    """Through a real batching engine with a small budget: a session decoding while two others
    prefill long prompts gets the solo run's logits, and so do they."""
    import copy
    import threading

    import torch

    from kvagent.runtime import CacheConfig, Engine

    base = tiny_engines["qwen3"]
    model = copy.deepcopy(base.model)
    batched = Engine.load(model, tokenizer=base.tokenizer, device="cpu", max_batch=4, prefill_budget=16)
    cfg = CacheConfig(policy="random", budget=24, buffer=8, protect="sink", prefill_chunk=16)
    gen = torch.Generator().manual_seed(11)
    prompts = [torch.randint(1, 500, (n,), generator=gen).tolist() for n in (20, 90, 70)]

    def run(engine, i, out):
        s = engine.session(cfg)
        rows = [s.append(prompts[i])]
        for t in range(30):
            rows.append(s.step((7 * i + t) % 400 + 1))
        out[i] = rows

    solo: dict = {}
    for i in range(3):
        run(base, i, solo)
    together: dict = {}
    threads = [threading.Thread(target=run, args=(batched, i, together)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    batched.close()
    assert batched.batcher.forwards < sum(len(r) for r in together.values())  # forwards were shared
    for i in range(3):
        for a, b in zip(solo[i], together[i], strict=True):
            torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "512"])
def test_prefill_budget_must_be_a_positive_int_or_none(qwen3_engine, bad):
    from kvagent.runtime.engine import Engine

    e = qwen3_engine
    with pytest.raises(ConfigError, match="prefill_budget: expected an int >= 1"):
        Engine(e.model, e.tokenizer, e.execution, e.backend, e.name, max_batch=2, prefill_budget=bad)
