"""The study's statistics, all from scipy: a mean with its bootstrap CI over episodes, a paired
comparison of two policies on the same episodes, and the trend of a margin with context length.

The unit of resampling is the episode (seeds of a random policy are averaged within an episode
first), so a CI says how much the result would move with other episodes of the same kind."""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
RESAMPLES = 4000
NAN = float("nan")


def _clean(xs: Sequence[float | None]) -> np.ndarray:
    a = np.asarray([x for x in xs if x is not None], dtype=float)
    return a[np.isfinite(a)]


@dataclass(frozen=True)
class MeanCI:
    mean: float
    lo: float
    hi: float
    n: int


def mean_ci(xs: Sequence[float | None], confidence: float = CONFIDENCE, seed: int = 0) -> MeanCI:
    """The mean and its percentile-bootstrap CI (`scipy.stats.bootstrap`). Percentile rather than
    BCa: BCa's jackknife is undefined on the 2-5 episodes a small study has. Fewer than two values:
    no interval (NaN bounds); all values equal: a zero-width interval."""
    a = _clean(xs)
    if a.size == 0:
        return MeanCI(NAN, NAN, NAN, 0)
    m = float(a.mean())
    if a.size < 2:
        return MeanCI(m, NAN, NAN, 1)
    if np.ptp(a) == 0:
        return MeanCI(m, m, m, int(a.size))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy warns about tiny samples; the width shows it
        res = stats.bootstrap(
            (a,),
            np.mean,
            confidence_level=confidence,
            n_resamples=RESAMPLES,
            method="percentile",
            rng=np.random.default_rng(seed),
        )
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    # Percentile bounds can miss the sample mean by a rounding hair when resamples are few.
    return MeanCI(m, min(lo, m), max(hi, m), int(a.size))


@dataclass(frozen=True)
class Paired:
    """a - b on the same episodes: mean difference with its CI, Wilcoxon signed-rank and sign-test
    p-values, and how often a was below, above or equal to b."""

    diff: MeanCI
    p_wilcoxon: float
    p_sign: float
    below: int
    above: int
    ties: int

    @property
    def n(self) -> int:
        return self.diff.n

    def excludes_zero(self) -> bool:
        d = self.diff
        return not (math.isnan(d.lo) or math.isnan(d.hi)) and (d.lo > 0 or d.hi < 0)


def paired(a: Sequence[float], b: Sequence[float], seed: int = 0) -> Paired:
    """Compare `a[i]` with `b[i]` (episode i under two settings): the paired bootstrap is the
    bootstrap of the per-episode differences."""
    if len(a) != len(b):
        raise ValueError(f"paired: {len(a)} vs {len(b)} values; pass the same episodes in the same order")
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    d = d[np.isfinite(d)]
    below, above = int((d < 0).sum()), int((d > 0).sum())
    ties = int(d.size - below - above)
    nonzero = below + above
    p_sign = float(stats.binomtest(below, nonzero, 0.5).pvalue) if nonzero else 1.0
    if nonzero == 0:
        p_w = 1.0
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            p_w = float(stats.wilcoxon(d, zero_method="zsplit").pvalue)
    return Paired(mean_ci(d, seed=seed), _unit(p_w), _unit(p_sign), below, above, ties)


def _unit(p: float) -> float:
    return 1.0 if math.isnan(p) else min(1.0, max(0.0, p))


@dataclass(frozen=True)
class Trend:
    """Least-squares slope of y on x (`scipy.stats.linregress`), its p-value (H0: slope 0) and the
    Spearman rank correlation."""

    slope: float
    p_slope: float
    rho: float
    p_rho: float
    n: int


def trend(x: Sequence[float], y: Sequence[float]) -> Trend:
    xa, ya = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    ok = np.isfinite(xa) & np.isfinite(ya)
    xa, ya = xa[ok], ya[ok]
    if xa.size < 3 or np.ptp(xa) == 0 or np.ptp(ya) == 0:
        return Trend(NAN, 1.0, NAN, 1.0, int(xa.size))
    lr = stats.linregress(xa, ya)
    sp = stats.spearmanr(xa, ya)
    return Trend(
        float(lr.slope), _unit(float(lr.pvalue)), float(sp.statistic), _unit(float(sp.pvalue)), int(xa.size)
    )


# ----------------------------------------------------------------------- the pre-registered tests
@dataclass(frozen=True)
class Shift:
    """Per-episode differences d (a log ratio of KL in the study) against a margin delta: the mean
    with its t intervals, and one-sided t-tests (`scipy.stats.ttest_1samp`):

    - p_equivalent: TOST, the larger p of H0: mu <= -delta and H0: mu >= +delta (small: |mu| < delta);
    - p_below: H0: mu >= 0 (small: d is below zero); p_above: H0: mu <= 0;
    - p_within_below: H0: mu <= -delta (small: d is above -delta, i.e. not below by the margin);
    - p_beyond_above: H0: mu <= +delta (small: d is above the margin)."""

    mean: float
    sd: float
    n: int
    lo95: float
    hi95: float
    lo90: float
    hi90: float
    p_equivalent: float
    p_below: float
    p_above: float
    p_within_below: float
    p_beyond_above: float


def _one_sided(d: np.ndarray, null: float, alternative: str) -> float:
    if d.size < 2:
        return 1.0
    if np.ptp(d) == 0:  # no spread: the t statistic is infinite or undefined; decide by the sign alone
        gap = float(d[0]) - null
        return 0.0 if (gap > 0 if alternative == "greater" else gap < 0) else 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # near-identical values: scipy warns, the p-value stands
        return _unit(float(stats.ttest_1samp(d, null, alternative=alternative).pvalue))


def _t_interval(d: np.ndarray, level: float) -> tuple[float, float]:
    if d.size < 2:
        return NAN, NAN
    m, se = float(d.mean()), float(d.std(ddof=1) / math.sqrt(d.size))
    half = float(stats.t.ppf(0.5 + level / 2, d.size - 1)) * se
    return m - half, m + half


def shift(d: Sequence[float], margin: float) -> Shift:
    a = _clean(d)
    if margin <= 0:
        raise ValueError(f"shift: the margin must be > 0, got {margin}")
    mean = float(a.mean()) if a.size else NAN
    sd = float(a.std(ddof=1)) if a.size > 1 else NAN
    lo95, hi95 = _t_interval(a, 0.95)
    lo90, hi90 = _t_interval(a, 0.90)
    p_low = _one_sided(a, -margin, "greater")  # H0: mu <= -margin
    p_high = _one_sided(a, margin, "less")  # H0: mu >= +margin
    return Shift(
        mean=mean, sd=sd, n=int(a.size), lo95=lo95, hi95=hi95, lo90=lo90, hi90=hi90,
        p_equivalent=max(p_low, p_high), p_below=_one_sided(a, 0.0, "less"),
        p_above=_one_sided(a, 0.0, "greater"), p_within_below=p_low,
        p_beyond_above=_one_sided(a, margin, "greater"),
    )  # fmt: skip


def holm(ps: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment: the i-th smallest p times (m - i), made monotone, capped at 1.
    Rejecting where the adjusted p < alpha keeps the family-wise error rate at alpha."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    out = [1.0] * len(ps)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - rank) * ps[i]))
        out[i] = running
    return out
