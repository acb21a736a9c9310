"""The sampler draws each token with exactly its probability under temperature, top-k and top-p
(empirical frequencies against the probabilities worked out here in plain Python, chi-square), never
a token outside the top-k or the nucleus, also where the nucleus spans most of the vocabulary, and
the same seed gives the same tokens."""

from __future__ import annotations

import math

import pytest
import torch
from scipy import stats

from kvagent.runtime import Sampling
from kvagent.runtime.sampling import sample_next


def expected(logits: list[float], s: Sampling) -> list[float]:
    """The distribution the API defines, computed without torch: softmax at the temperature, the
    top_k largest kept, then the smallest prefix (largest first) whose mass before a token is still
    under top_p, renormalised."""
    scores = [x / s.temperature for x in logits]
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    if s.top_k:
        order = order[: s.top_k]
    top = max(scores[i] for i in order)
    weights = {i: math.exp(scores[i] - top) for i in order}
    total = sum(weights.values())
    kept, before = [], 0.0
    for i in order:
        if before >= s.top_p:
            break
        kept.append(i)
        before += weights[i] / total
    z = sum(weights[i] for i in kept)
    return [weights[i] / z if i in kept else 0.0 for i in range(len(logits))]


def draw(logits: torch.Tensor, s: Sampling, n: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return [sample_next(logits, s, g) for _ in range(n)]


def check_frequencies(logits: list[float], s: Sampling, n: int) -> None:
    probs = expected(logits, s)
    counts = [0] * len(logits)
    for t in draw(torch.tensor(logits), s, n):
        counts[t] += 1
    outside = [i for i, p in enumerate(probs) if p == 0 and counts[i]]
    assert not outside, f"{s}: drew tokens outside the top-k / nucleus: {outside}"
    support = [i for i, p in enumerate(probs) if p > 0]
    observed = [counts[i] for i in support]
    want = [probs[i] * n for i in support]
    assert min(want) >= 5, "too few draws for a chi-square test"
    p = stats.chisquare(observed, want).pvalue
    assert p > 1e-4, (
        f"{s}: frequencies are not the probabilities (chi-square p={p:.2g}): {observed} vs {want}"
    )


LOGITS = [1.2, 1.0, 0.9, 0.3, 0.0, -0.4, -0.5, -0.8]


@pytest.mark.parametrize(
    "sampling",
    [
        Sampling(temperature=1.0),
        Sampling(temperature=0.6),
        Sampling(temperature=1.3, top_k=3),
        Sampling(temperature=1.0, top_p=0.7),
        Sampling(temperature=0.8, top_p=0.9, top_k=5),
    ],
    ids=["t1", "t0.6", "topk3", "topp0.7", "topk5-topp0.9"],
)
def test_frequencies_are_the_probabilities(sampling):
    check_frequencies(LOGITS, sampling, 4000)


def test_a_wide_nucleus_is_exact_as_it_widens_and_when_it_sorts_everything():
    # 3000 tokens, 150 near the top: the first 64 candidates hold less than top_p, the 512 largest
    # do (the sampler widens once); then a nearly flat vocabulary whose nucleus is most of it (a sort)
    gen = torch.Generator().manual_seed(3)
    wide = [5.0 + 0.01 * float(x) for x in torch.randn(150, generator=gen)] + [0.0] * 2850
    assert 64 < sum(p > 0 for p in expected(wide, Sampling(temperature=1.0, top_p=0.8))) < 150
    check_frequencies(wide, Sampling(temperature=1.0, top_p=0.8), 2500)
    flat = [0.001 * float(x) for x in torch.randn(1000, generator=gen)]
    probs = expected(flat, Sampling(temperature=1.0, top_p=0.85))
    assert 800 < sum(p > 0 for p in probs) < 900
    seen = set(draw(torch.tensor(flat), Sampling(temperature=1.0, top_p=0.85), 1000))
    assert all(probs[t] > 0 for t in seen), "drew a token outside a nucleus of most of the vocabulary"
    assert len(seen) > 450


def test_the_same_seed_gives_the_same_tokens():
    logits = torch.randn(5000, generator=torch.Generator().manual_seed(1)) * 2
    for s in (
        Sampling(temperature=1.0),
        Sampling(temperature=0.7, top_p=0.9),
        Sampling(temperature=1.0, top_k=40),
    ):
        a, b, c = draw(logits, s, 64, seed=7), draw(logits, s, 64, seed=7), draw(logits, s, 64, seed=8)
        assert a == b, f"{s}: the same seed drew different tokens"
        assert a != c, f"{s}: different seeds drew the same 64 tokens"


def test_greedy_is_the_argmax():
    logits = torch.randn(3000, generator=torch.Generator().manual_seed(2))
    assert draw(logits, Sampling(), 3) == [int(logits.argmax())] * 3
