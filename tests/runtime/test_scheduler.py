"""The scheduler's choice of a forward's chunks: the token cap, max_batch and the prefill budget."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from kvagent.errors import ConfigError
from kvagent.runtime.scheduler import Scheduler


def _pending(*sizes: int) -> list:
    return [
        (float(i), SimpleNamespace(ids=[0] * q, name=f"c{i}"), threading.Event()) for i, q in enumerate(sizes)
    ]


def _picked(sched: Scheduler, *sizes: int) -> list[int]:
    """The sizes of the chunks the next forward takes (no session is in a call, so no waiting)."""
    sched._pending = _pending(*sizes)
    return [len(c.ids) for _, c, _ in sched._take()]


def test_with_decode_tokens_waiting_a_forward_takes_prefill_only_up_to_the_budget():
    sched = Scheduler(None, max_batch=8, prefill_budget=512)
    # Oldest first: two 512-token prompt chunks and three decode tokens; one chunk rides along.
    assert _picked(sched, 512, 1, 512, 1, 1) == [512, 1, 1, 1]
    # Smaller chunks fill the budget together; the one that would pass it waits.
    assert _picked(sched, 200, 1, 300, 100, 1) == [200, 1, 300, 1]


def test_a_prefill_chunk_over_the_budget_still_runs_so_prompts_never_starve():
    sched = Scheduler(None, max_batch=8, prefill_budget=64)
    assert _picked(sched, 1, 1, 512, 512) == [1, 1, 512]


def test_without_decode_tokens_prefill_is_bounded_by_the_token_cap_alone():
    sched = Scheduler(None, max_batch=8, max_tokens=1500, prefill_budget=512)
    assert _picked(sched, 512, 512, 512, 512) == [512, 512]


def test_no_budget_takes_chunks_as_the_token_cap_allows():
    sched = Scheduler(None, max_batch=8, max_tokens=4096, prefill_budget=None)
    assert _picked(sched, 512, 1, 512, 1) == [512, 1, 512, 1]


def test_a_chunk_over_the_token_cap_waits_while_later_decode_tokens_go():
    sched = Scheduler(None, max_batch=3, max_tokens=600, prefill_budget=None)
    assert _picked(sched, 512, 512, 1, 1, 1) == [512, 1, 1]
    # The oldest chunk always goes, whatever its size.
    assert _picked(sched, 900, 1) == [900]


def test_the_picked_chunks_leave_the_queue_and_the_rest_keep_their_order():
    sched = Scheduler(None, max_batch=8, prefill_budget=512)
    sched._pending = _pending(512, 1, 512, 1)
    assert [c.name for _, c, _ in sched._take()] == ["c0", "c1", "c3"]
    assert [c.name for _, c, _ in sched._pending] == ["c2"]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "512"])
def test_prefill_budget_must_be_a_positive_int_or_none(qwen3_engine, bad):
    from kvagent.runtime.engine import Engine

    e = qwen3_engine
    with pytest.raises(ConfigError, match="prefill_budget: expected an int >= 1"):
        Engine(e.model, e.tokenizer, e.device, e.dtype, e.backend, e.name, max_batch=2, prefill_budget=bad)
