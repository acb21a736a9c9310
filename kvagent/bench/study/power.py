"""How many episodes a pre-registered margin needs: the power of the study's one-sample t-tests on
per-episode log ratios, from the noncentral t distribution (`scipy.stats.nct`).

Each test in a family of m is run at alpha / m here (Bonferroni), which Holm's step-down never
exceeds, so the episode count is enough for the Holm-corrected family too (conservative)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy import stats

MAX_EPISODES = 10_000


def power_one_sided(n: int, sd: float, distance: float, alpha: float) -> float:
    """P(a one-sided t-test at `alpha` rejects) when the true mean is `distance` beyond the null."""
    if n < 2 or sd <= 0:
        return 0.0
    df = n - 1
    crit = stats.t.ppf(1 - alpha, df)
    return float(1 - stats.nct.cdf(crit, df, distance * math.sqrt(n) / sd))


def power_equivalence(n: int, sd: float, margin: float, alpha: float) -> float:
    """A lower bound of TOST's power at a true mean of 0 (each one-sided half fails with the
    probability the noncentral t gives; power >= 1 - both)."""
    if n < 2 or sd <= 0:
        return 0.0
    df = n - 1
    crit = stats.t.ppf(1 - alpha, df)
    return max(0.0, float(1 - 2 * stats.nct.cdf(crit, df, margin * math.sqrt(n) / sd)))


@dataclass(frozen=True)
class PowerPlan:
    test: str  # "equivalence" | "one-sided"
    sd: float  # assumed SD of the per-episode log ratio (the pilot's)
    margin: float
    alpha: float  # family-wise
    family: int  # tests in the Holm family
    target: float  # power wanted
    needed: int  # episodes for that power (MAX_EPISODES: not reachable)

    @property
    def per_test_alpha(self) -> float:
        return self.alpha / self.family

    def power(self, n: int) -> float:
        f = power_equivalence if self.test == "equivalence" else power_one_sided
        return f(n, self.sd, self.margin, self.per_test_alpha)

    def reachable_margin(self, n: int, sd: float | None = None) -> float:
        """The smallest margin these n episodes resolve with the target power (at `sd`, default the
        assumed one): what a study of n episodes can say."""
        s = self.sd if sd is None else sd
        if n < 2 or not s > 0:
            return math.inf
        lo, hi = 0.0, 1.0
        f = power_equivalence if self.test == "equivalence" else power_one_sided
        while f(n, s, hi, self.per_test_alpha) < self.target and hi < 1e6:
            hi *= 2
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if f(n, s, mid, self.per_test_alpha) < self.target else (lo, mid)
        return hi


def plan_power(test: str, sd: float, margin: float, alpha: float, family: int, target: float) -> PowerPlan:
    if test not in ("equivalence", "one-sided"):
        raise ValueError(f"plan_power: test must be equivalence or one-sided, got {test!r}")
    plan = PowerPlan(test, sd, margin, alpha, family, target, MAX_EPISODES)
    n = next((n for n in range(2, MAX_EPISODES) if plan.power(n) >= target), MAX_EPISODES)
    return PowerPlan(test, sd, margin, alpha, family, target, n)
