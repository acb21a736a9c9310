"""Nexus Sampling: block-level sampling by window attention plus a short co-attention walk."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from kvagent.errors import ConfigError
from kvagent.runtime.policies._args import bool_knob, float_knob, int_arg, int_knob, knob, recency_knob
from kvagent.runtime.policies._attn import window_attention
from kvagent.runtime.policies.base import BasePolicy, LayerView, own_recency, register

_TINY = 1e-20  # floor on weights and row sums: keeps logs finite, never changes an order


def block_rows(view: LayerView, n_blocks: int) -> torch.Tensor:
    """(B, W, n_blocks): head-averaged window attention summed per block, each row summing to 1.

    Entries with block id -1 (protected or forced-recent) are outside every candidate block and
    do not count. A row with no mass on any candidate block stays all zero.
    """
    b, w = view.queries.shape[0], view.queries.shape[2]
    rows = torch.zeros((b, w, n_blocks), dtype=torch.float32, device=view.keys.device)
    if w == 0:
        return rows
    probs = window_attention(
        view.queries, view.query_positions, view.keys, view.positions, view.group_size, view.scaling
    )
    mean = probs.mean(dim=1)  # (B, W, N): average over all query heads (one keep-set per layer)
    ids = view.block_ids.to(mean.device)
    cand = ids >= 0
    # Non-candidates add an exact 0 to block 0, rather than a boolean-mask index (a host sync on a GPU).
    rows.index_add_(2, ids.clamp(min=0), mean * cand)
    return rows / rows.sum(dim=-1, keepdim=True).clamp_min(_TINY)


def nexus_weights(
    rows: torch.Tensor, walk_steps: int, lam: float, eps_tie: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Direct score a, walk score c and weight w, each (B, n_blocks), from rows (B, W, n_blocks).

    a = mean of the rows. The walk starts at C = 0 and runs over the last `walk_steps` rows in
    time order: gamma_q = 1 + <a_q, C>, C <- C + gamma_q * a_q, so a row that agrees with what
    the previous rows attended counts more, and blocks that bridge consecutive rows gain.
    c = C / |C|_1; w = a + lam * c + eps_tie * ramp (ramp 0 oldest block -> 1 newest).
    """
    b, w_rows, nb = rows.shape
    a = rows.mean(dim=1) if w_rows else rows.new_zeros((b, nb))
    C = rows.new_zeros((b, nb))
    for t in range(max(0, w_rows - walk_steps), w_rows):  # at most walk_steps iterations
        a_q = rows[:, t]
        gamma = 1.0 + (a_q * C).sum(dim=-1, keepdim=True)
        C = C + gamma * a_q
    c = C / C.sum(dim=-1, keepdim=True).clamp_min(_TINY)
    ramp = torch.arange(nb, dtype=rows.dtype, device=rows.device) / max(1, nb - 1)
    w = a + lam * c + eps_tie * ramp
    return a, c, w


def log_priority(w: torch.Tensor, n: float, generator: torch.Generator) -> torch.Tensor:
    """log pi_j with pi_j = mean_i u_ij^(1/w_j) over n i.i.d. uniforms, (B, n_blocks) float64.

    Computed as logsumexp_i(log(u_ij) / w_j) - log n: u^(1/w) itself underflows to 0 for small w
    and would tie every small-weight block. n = 1 is A-Res (Efraimidis-Spirakis). n = inf (or 0)
    is the deterministic limit E[u^(1/w)] = w / (1 + w), monotone in w: top-K by w.
    """
    wd = w.to(torch.float64).clamp_min(_TINY)
    if math.isinf(n) or n == 0:
        return wd.log() - wd.log1p()
    n = int(n)
    dev = generator.device
    # The generator is on the cache's device (round.round_generator): no host copy.
    u = torch.rand((wd.shape[0], n, wd.shape[1]), generator=generator, dtype=torch.float64, device=dev)
    logu = u.clamp_min(torch.finfo(torch.float64).tiny).log()  # rand may return exactly 0
    lp = torch.logsumexp(logu / wd.to(dev).unsqueeze(1), dim=1) - math.log(n)
    return lp.to(w.device)


def sample_count(name: str, value: Any) -> float:
    """Nexus's n: draws averaged per block; 0 or inf is the deterministic limit."""
    if (isinstance(value, int) and not isinstance(value, bool) and value >= 0) or (
        isinstance(value, float) and value == math.inf
    ):
        return value
    raise ConfigError(
        f"policy_args.{name}: must be an int >= 1, or 0 / inf for deterministic top-K, got {value!r}"
    )


@register
@dataclass
class NexusPolicy(BasePolicy):
    """Nexus Sampling (this project's method; see docs/architecture.md, "Policies").

    One keep-set per layer, whole blocks of `block` entries. Block weight w mixes the direct
    window attention a with a short walk c over the last `walk_steps` window rows (`lam` = 0
    disables the walk); blocks holding the first `sink_blocks * block` positions of the episode
    and the last `recent_blocks` candidate blocks are forced (None, the default, leaves the recent
    ones to the framework: 1 under topk-all, 0 under recent-buffer, whose recent buffer of whole
    blocks is kept outside the candidates); the rest are ranked by the n-averaged reservoir
    priority of w (`n=1` A-Res, `n=inf` or `n=0` deterministic top-K by w). Every entry gets its
    block's log-priority.
    `normalize=True` rescales w to mean 1 before sampling (see block_priorities).
    """

    name = "nexus"
    shared_across_heads = True

    block: int = int_knob(32, 1)  # the contract's block granularity, set by this knob
    walk_steps: int = int_knob(3, 0)
    lam: float = float_knob(0.5)
    n: float = knob(5, sample_count)
    eps_tie: float = float_knob(1e-6)
    recent_blocks: int | None = recency_knob(int_arg, minimum=0)
    sink_blocks: int = int_knob(1, 0)
    normalize: bool = bool_knob(False)

    def block_priorities(self, view: LayerView) -> torch.Tensor:
        """(B, n_blocks) log-priority per candidate block, +inf for forced blocks."""
        if view.block_ids is None:
            raise ValueError("nexus: the runtime must pass block_ids (the policy has block > 1)")
        ids = view.block_ids
        nb = int(ids.max().item()) + 1 if ids.numel() else 0
        rows = block_rows(view, nb)
        _, _, w = nexus_weights(rows, self.walk_steps, self.lam, self.eps_tie)
        if self.normalize:
            # w sums to about 1 + lam, so w_j ~ 1/n_blocks and u^(1/w) is dominated by the
            # largest of the n draws: any n then samples like A-Res. Mean-1 weights make n bite;
            # the order by w (n = inf) and A-Res (n = 1) are unchanged by the rescale.
            w = w / w.mean(dim=-1, keepdim=True).clamp_min(_TINY)
        lp = log_priority(w, self.n, view.generator).to(torch.float32)
        return lp.masked_fill(self._forced(view, nb).to(lp.device), float("inf"))

    def _forced(self, view: LayerView, nb: int) -> torch.Tensor:
        """(B, n_blocks) bool: sink blocks and the newest `recent_blocks` blocks.

        Sink = any block holding one of the episode's first `sink_blocks * block` positions. By
        position rather than "block 0" because the runtime re-partitions each round (blocks are
        aligned to the newest entry), so the sink tokens can straddle two blocks later on; and a
        protected prompt already holds the sink, so no candidate block is spent on it then.
        """
        ids = view.block_ids.to(view.positions.device)
        b = view.positions.shape[0]
        cand = ids >= 0
        pos = view.positions[:, 0]  # shared keep-sets: every head holds the same positions
        hit = ((pos < self.sink_blocks * self.block) & cand).float()  # non-candidates add 0 to block 0
        sink = torch.zeros((b, nb), device=pos.device).index_add_(1, ids.clamp(min=0), hit) > 0
        # Block ids ascend with age: the last ones are the newest.
        newest = torch.arange(nb, device=pos.device) >= nb - own_recency(self.recent_blocks, 1, 0, view)
        return sink | newest

    def scores(self, view: LayerView) -> torch.Tensor:
        b, _, n = view.positions.shape
        lp = self.block_priorities(view)
        if lp.shape[1] == 0:  # no candidate block: everything is kept by the runtime
            return torch.full((b, 1, n), float("inf"), dtype=torch.float32, device=view.keys.device)
        ids = view.block_ids.to(lp.device)
        # Each candidate its block's priority, the rest +inf (kept by the runtime anyway).
        out = torch.where(ids >= 0, lp[:, ids.clamp(min=0)], float("inf")).unsqueeze(1)
        return out.to(view.keys.device)
