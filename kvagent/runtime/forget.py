"""`Session.forget` and `Session.rewind`: drop chosen logical positions from a session, exactly
and at once (forget: any fed positions, the tokens stay in the stream; rewind: the stream's newest
tokens, which leave it).

Persistent mode evicts those positions from every layer and KV head that still holds them, now,
like a round whose keep-set the caller chose (counted in `stats.evicted` and `stats.forgotten`,
audited with `forced=True`); the kept entries keep their positions, so RoPE is untouched. Heads
that lose different counts leave the layer ragged: shorter heads start with PAD entries
(cache.py) that attention masks out. Reprefill mode removes the tokens from the history instead;
the next forward re-prefills it, as re-rendering the chat without them would.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from kvagent.errors import ConfigError
from kvagent.runtime.audit import record
from kvagent.runtime.cache import keep_index
from kvagent.runtime.eviction import pad_state

if TYPE_CHECKING:
    from kvagent.runtime.session import Session


def check_positions(positions: Sequence[int], logical_length: int) -> list[int]:
    """Sorted distinct positions, each an int in [0, logical_length)."""
    if isinstance(positions, torch.Tensor):
        positions = positions.flatten().tolist()
    out = set()
    for p in positions:
        if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p < logical_length:
            raise ConfigError(
                f"forget: position {p!r} is not a fed token; pass ints in [0, {logical_length})"
            )
        out.add(p)
    return sorted(out)


def forget_persistent(session: Session, positions: list[int]) -> int:
    """Evict `positions` from the live cache; returns how many distinct positions were held."""
    if not positions:
        return 0
    wanted = torch.tensor(positions)
    gone, n_drop = drop_entries(session, lambda live: torch.isin(live, wanted.to(live.device)))
    session._stats.evicted += n_drop
    session._stats.forgotten += n_drop
    return len(gone)


def drop_entries(session: Session, which) -> tuple[set[int], int]:
    """Drop from every layer and KV head the entries `which(positions) -> bool mask` selects, now,
    like a round whose keep-set the caller chose (audited with `forced=True`). Returns the distinct
    positions dropped and the (layer, head) entries dropped."""
    gone: set[int] = set()
    dropped = 0
    for li, layer in enumerate(session.cache.layers):
        if not layer.is_initialized or layer.n == 0:
            continue
        live = layer.live()[2]
        drop = which(live) & (live >= 0)
        n_drop = int(drop.sum().item())
        if not n_drop:
            continue
        gone.update(live[drop].unique().tolist())
        index = keep_index(live, drop)
        state = session._state[li]
        pad_state(state, layer.n)  # state of entries appended since the last round
        layer.compact(index, max(layer.capacity_hint, index.shape[-1]), pad=True)
        per_entry = state.get("per_entry", {})
        src = index.clamp(min=0)
        for name, t in per_entry.items():
            per_entry[name] = t.expand(src.shape[0], src.shape[1], -1).gather(-1, src)
        dropped += n_drop
        record(session, li, forced=True)
    if dropped:
        session._round += 1  # audit records stay ordered: this drop sits between two rounds
    return gone, dropped


def rewind(session: Session, n: int) -> int:
    """`Session.rewind`: take back the newest `n` tokens; see there."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise ConfigError(f"rewind: n must be an int, got {n!r}")
    top = session.logical_length - (session.prompt_length or 0)
    if not 0 <= n <= top:
        raise ConfigError(
            f"rewind: n={n} is outside [0, {top}]; rewind at most the tokens fed after the first append"
        )
    if n == 0:
        return 0
    cut = session.logical_length - n
    session.history = session.history[:cut]
    session._last_logits = None
    session._stats.rewound += n
    if session.config.mode == "reprefill":
        session._stale = True
        return n
    drop_entries(session, lambda live: live >= cut)
    session.cache.drop_queries_from(cut)
    return n


def forget_history(session: Session, positions: list[int]) -> int:
    """Reprefill mode: remove `positions` from the history; the next forward re-prefills it."""
    if not positions:
        return 0
    drop = set(positions)
    session.history = [t for i, t in enumerate(session.history) if i not in drop]
    if session.prompt_length is not None:
        session.prompt_length -= sum(1 for p in positions if p < session.prompt_length)
    session._stale = True
    return len(positions)
