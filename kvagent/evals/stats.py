"""Statistics over finished runs: Resolved / Pass@1 per configuration, paired clustered bootstrap CIs,
exact sign tests between policies, and mean cost figures.

A configuration is what a run's label names (policy, mode, budget, and any other setting that differs
from its default), `RunSpec.configuration`: not the seed. An instance's score under a configuration
is the mean of its `resolved` over seeds; Pass@1 is the mean of those scores over instances. Uncertainty comes from the
instances (the clusters): every bootstrap replicate draws one multiset of instances and evaluates all
configurations on it, so differences between configurations are paired.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kvagent.errors import KvagentError
from kvagent.fileio import read_jsonl
from kvagent.runspec import DEFAULTS, RunSpec

RUN_FIELDS = ("instance_id", "policy", "mode", "budget", "seed", "resolved")
COST_FIELDS = ("steps", "tokens", "evictions", "kv_bytes")


def is_infra_error(run: Mapping[str, Any]) -> bool:
    """A run that failed for a reason outside the policy (no image, a sandbox or grader that broke, a
    crashed episode): recorded, redone by the next `kvagent eval`, and never counted in Pass@1.
    Records older than the `infra_error` field count every `exit_status: error` as one."""
    flag = run.get("infra_error")
    return bool(flag) if flag is not None else run.get("exit_status") == "error"


def settle(runs: Iterable[Mapping[str, Any]], key: Any) -> dict[Any, dict[str, Any]]:
    """One record per `key(run)`: the last finished one, else (only errors so far) the last error."""
    out: dict[Any, dict[str, Any]] = {}
    for r in runs:
        k = key(r)
        if k not in out or not is_infra_error(r) or is_infra_error(out[k]):
            out[k] = dict(r)
    return out


def config_of(run: Mapping[str, Any]) -> RunSpec:
    """The configuration a run record belongs to: its spec less what the label leaves out (the seed
    above all); fields the record lacks (written before they were recorded) have their defaults."""
    return RunSpec.from_record(run).configuration


def shown_variant(cfg: RunSpec) -> list[str]:
    """The label parts a table shows beside the policy: the framework only where it is not today's
    default (labels compare with the pre-#26 baseline, so every default run's label names
    recent-buffer, which a table row need not repeat)."""
    parts = [p for p, k in zip(cfg.variant, cfg.varied, strict=True) if k != "framework"]
    if cfg.evicts and cfg.framework != DEFAULTS["framework"]:
        parts.append(cfg.framework)
    return parts


def policy_name(cfg: RunSpec) -> str:
    """The policy as tables show it: `snapkv`, or `snapkv (heads-adaptive)` for a variant."""
    parts = shown_variant(cfg)
    return f"{cfg.policy} ({', '.join(parts)})" if parts else cfg.policy


def config_fields(cfg: RunSpec) -> dict[str, Any]:
    return {
        "policy": cfg.policy,
        "mode": cfg.mode,
        "budget": cfg.budget,
        "framework": cfg.framework if cfg.evicts else None,
        "variant": ", ".join(shown_variant(cfg)),
    }


def _budget_key(budget: Any) -> tuple[int, float, str]:
    # Numbers ascending, then anything else (None, strings) by text.
    if isinstance(budget, int | float) and not isinstance(budget, bool):
        return (0, float(budget), "")
    return (1, 0.0, str(budget))


def load_runs(path: str | Path) -> list[dict[str, Any]]:
    """Read `runs.jsonl`; each record must carry RUN_FIELDS (errors name the line and field)."""
    path = Path(path)
    if not path.is_file():
        raise KvagentError(f"no runs file at {path}; run `kvagent eval` first")
    runs = []
    for lineno, rec in read_jsonl(path):
        if not isinstance(rec, dict):
            raise KvagentError(f"{path}:{lineno}: expected a JSON object")
        for name in RUN_FIELDS:
            if name not in rec:
                raise KvagentError(f"{path}:{lineno}: run record lacks field {name!r}")
        runs.append(rec)
    return runs


# ------------------------------------------------------------------------------------------- exact tests


def sign_test(wins: int, losses: int) -> float:
    """Exact two-sided sign test: P(a split at least this lopsided | no difference), ties dropped
    (`scipy.stats.binomtest` at p = 1/2)."""
    from scipy import stats

    if wins < 0 or losses < 0:
        raise ValueError("counts must be non-negative")
    n = wins + losses
    if n == 0:
        return 1.0
    return float(stats.binomtest(wins, n, 0.5).pvalue)


# --------------------------------------------------------------------------------------------- tables


@dataclass
class Table:
    """Per-instance scores: `scores[c, i]` = mean resolved over seeds of instance i under config c
    (NaN where config c has no run of instance i)."""

    configs: list[RunSpec]
    instances: list[str]
    scores: np.ndarray
    seeds: list[list[Any]]  # per config, the seeds seen
    runs: dict[RunSpec, list[dict[str, Any]]]


def build_table(runs: Iterable[Mapping[str, Any]]) -> Table:
    by_cfg: dict[RunSpec, list[dict[str, Any]]] = {}
    for r in runs:
        by_cfg.setdefault(config_of(r), []).append(dict(r))
    configs = sorted(by_cfg, key=lambda c: (c.mode, c.policy, _budget_key(c.budget)))
    instances = sorted({str(r["instance_id"]) for rs in by_cfg.values() for r in rs})
    col = {iid: j for j, iid in enumerate(instances)}
    scores = np.full((len(configs), len(instances)), np.nan)
    seeds = []
    for c, cfg in enumerate(configs):
        sums: dict[int, list[float]] = {}
        # A rerun of the same (instance, seed) replaces the earlier record; infrastructure errors
        # are kept for their count but score nothing (an instance with only errors is left out).
        latest = settle(by_cfg[cfg], lambda r: (str(r["instance_id"]), json.dumps(r["seed"])))
        by_cfg[cfg] = list(latest.values())
        for (iid, _), r in latest.items():
            if not is_infra_error(r):
                sums.setdefault(col[iid], []).append(1.0 if r["resolved"] is True else 0.0)
        for j, vals in sums.items():
            scores[c, j] = sum(vals) / len(vals)
        seeds.append(sorted({json.dumps(r["seed"]) for r in latest.values() if not is_infra_error(r)}))
    return Table(configs, instances, scores, [[json.loads(s) for s in ss] for ss in seeds], by_cfg)


def _nanmean_rows(x: np.ndarray) -> np.ndarray:
    """Mean over the last axis ignoring NaN; NaN where a row is all NaN (no warning)."""
    mask = ~np.isnan(x)
    count = mask.sum(axis=-1)
    total = np.where(mask, x, 0.0).sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def bootstrap_indices(n_instances: int, n_boot: int, seed: int) -> np.ndarray:
    """One (n_boot, n_instances) draw of instance indices with replacement, shared by all statistics."""
    rng = np.random.default_rng(seed)
    if n_instances == 0:
        return np.zeros((n_boot, 0), dtype=np.int64)
    return rng.integers(0, n_instances, size=(n_boot, n_instances))


def percentile_ci(samples: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    s = samples[~np.isnan(samples)]
    if s.size == 0:
        return (math.nan, math.nan)
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(s, [alpha, 1.0 - alpha])
    return (float(lo), float(hi))


def _mean(values: Sequence[Any]) -> float | None:
    nums = [float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    return sum(nums) / len(nums) if nums else None


def summarize(
    runs: Iterable[Mapping[str, Any]],
    *,
    n_boot: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> dict[str, Any]:
    """All report numbers as one JSON-able dict: `configs` (one row per configuration) and
    `comparisons` (every pair of policies within a mode x budget)."""
    table = build_table(runs)
    idx = bootstrap_indices(len(table.instances), n_boot, seed)
    # boot[c, b] = Pass@1 of config c in replicate b; NaN-aware so unbalanced tables still work.
    boot = (
        np.stack([_nanmean_rows(row[idx]) for row in table.scores])
        if table.configs
        else np.zeros((0, n_boot))
    )

    rows = []
    for c, cfg in enumerate(table.configs):
        row_scores = table.scores[c]
        present = ~np.isnan(row_scores)
        cruns = table.runs[cfg]
        pass1 = float(row_scores[present].mean()) if present.any() else math.nan
        errors = [r for r in cruns if is_infra_error(r)]
        cruns = [r for r in cruns if not is_infra_error(r)]
        n_seeds = len(table.seeds[c])
        resolved_runs = sum(1 for r in cruns if r["resolved"] is True)
        lo, hi = percentile_ci(boot[c], level)
        exit_counts: dict[str, int] = {}
        for r in cruns:
            key = str(r.get("exit_status"))
            exit_counts[key] = exit_counts.get(key, 0) + 1
        rows.append(
            {
                **config_fields(cfg),
                "label": cfg.label,
                "n_instances": int(present.sum()),
                "n_runs": len(cruns),
                "seeds": table.seeds[c],
                "resolved_runs": resolved_runs,
                # Instances resolved per seed, averaged over seeds (the usual "Resolved" count).
                "resolved": resolved_runs / n_seeds if n_seeds else 0.0,
                "pass_at_1": pass1,
                "pass_at_1_ci": [lo, hi],
                # Resolved by at least one seed.
                "pass_at_k": float((row_scores[present] > 0).mean()) if present.any() else math.nan,
                **{f"mean_{name}": _mean([r.get(name) for r in cruns]) for name in COST_FIELDS},
                "exit_status": exit_counts,
                "n_errors": len(errors),
                "errors": sorted({str(r.get("error") or "error") for r in errors})[:3],
            }
        )

    def compare(a: int, b: int) -> dict[str, Any]:
        both = ~np.isnan(table.scores[a]) & ~np.isnan(table.scores[b])
        diff_row = np.where(both, table.scores[a] - table.scores[b], np.nan)
        diffs = diff_row[both]
        wins = int((diffs > 0).sum())
        losses = int((diffs < 0).sum())
        lo, hi = percentile_ci(_nanmean_rows(diff_row[idx]), level)
        ca, cb = table.configs[a], table.configs[b]
        return {
            "mode": ca.mode,
            "budget": ca.budget,
            "a": policy_name(ca),
            "b": policy_name(cb),
            "b_budget": cb.budget,
            "n_paired": int(both.sum()),
            "diff": float(diffs.mean()) if diffs.size else math.nan,
            "diff_ci": [lo, hi],
            "a_better": wins,
            "b_better": losses,
            "ties": int(both.sum()) - wins - losses,
            "sign_test_p": sign_test(wins, losses),
        }

    comparisons = []
    # Policies against each other at the same mode and budget ...
    groups: dict[tuple[str, str], list[int]] = {}
    for c, cfg in enumerate(table.configs):
        groups.setdefault((cfg.mode, json.dumps(cfg.budget)), []).append(c)
    for members in groups.values():
        for ai, a in enumerate(members):
            for b in members[ai + 1 :]:
                comparisons.append(compare(a, b))
    # ... and every budgeted configuration against the unbudgeted ones (e.g. `full`) of its mode.
    for c, cfg in enumerate(table.configs):
        if _budget_key(cfg.budget)[0] != 0:
            continue
        for r, ref in enumerate(table.configs):
            if ref.mode == cfg.mode and _budget_key(ref.budget)[0] != 0:
                comparisons.append(compare(c, r))

    return {
        "n_runs": sum(1 for v in table.runs.values() for r in v if not is_infra_error(r)),
        "n_errors": sum(row["n_errors"] for row in rows),
        "instances": table.instances,
        "bootstrap": {
            "n_boot": n_boot,
            "seed": seed,
            "level": level,
            "clusters": "instances",
            "paired": True,
        },
        "configs": rows,
        "comparisons": comparisons,
    }
