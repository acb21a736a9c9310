"""Is a recipe good? (`kvagent images check`): build the image, grade the empty patch and the gold
patch in it, and say for each instance what holds and, where not, why.

A recipe is verified when
  builds             the image builds offline from the recipe;
  tests_found        every FAIL_TO_PASS and PASS_TO_PASS name has a result in the gold patch's test
                     output (a name the log never shows would be graded failed without a sign:
                     a test missing from the source, a name spelt otherwise);
  f2p_fail_before    every FAIL_TO_PASS test fails (or is absent) before the gold patch, so the
                     source really is the base commit's and not a later release with the fix;
  empty_fails        the empty patch is not resolved;
  gold_resolves      the gold patch resolves: FAIL_TO_PASS pass, PASS_TO_PASS still pass.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from kvagent.errors import KvagentError
from kvagent.evals.datasets import Instance

CHECKS = ("builds", "tests_found", "f2p_fail_before", "empty_fails", "gold_resolves")
Log = Callable[[str], None]
OpenImage = Callable[[str], AbstractContextManager[Any]]  # image tag -> a fresh sandbox of it


def _quiet(_: str) -> None:
    pass


def _names(tests: list[str], n: int = 3) -> str:
    more = f" (+{len(tests) - n} more)" if len(tests) > n else ""
    return ", ".join(tests[:n]) + more


def _status(details: Mapping[str, Any], key: str, part: str) -> list[str]:
    return list(((details.get("tests_status") or {}).get(key) or {}).get(part) or [])


def _grade(instance: Instance, patch: str, open_image: OpenImage, tag: str, recipes: Any, timeout: int,
           logs: Path | None) -> dict:  # fmt: skip
    from kvagent.evals.grading import grade_instance

    return grade_instance(
        instance, patch, open_env=lambda _: open_image(tag), timeout=timeout, log_dir=logs, recipes=recipes
    )


def judge(empty: Mapping[str, Any], gold: Mapping[str, Any] | None) -> dict[str, Any]:
    """The checks that follow from the empty-patch and gold-patch gradings, with reasons."""
    out: dict[str, Any] = {"reasons": []}
    reasons = out["reasons"]
    if empty.get("error"):
        out["empty_fails"] = out["f2p_fail_before"] = False
        reasons.append(f"empty patch: {empty['error']}")
    else:
        out["empty_fails"] = not empty.get("resolved")
        if not out["empty_fails"]:
            reasons.append("the empty patch resolves: the source already holds the fix")
        passed = _status(empty, "FAIL_TO_PASS", "success")
        out["f2p_fail_before"] = not passed
        if passed:
            reasons.append(f"FAIL_TO_PASS pass before the gold patch: {_names(passed)}")
    if gold is None:
        return out
    missing = gold.get("missing_tests")
    out["tests_found"] = missing == [] if missing is not None else None
    if missing:
        reasons.append(
            f"{len(missing)} FAIL_TO_PASS/PASS_TO_PASS names are not in the gold run's test output: "
            f"{_names(missing, 5)}"
        )
    out["gold_resolves"] = bool(gold.get("resolved"))
    if gold.get("error"):
        reasons.append(f"gold patch: {gold['error']}")
    elif not out["gold_resolves"]:
        f2p, p2p = _status(gold, "FAIL_TO_PASS", "failure"), _status(gold, "PASS_TO_PASS", "failure")
        if f2p:
            reasons.append(f"with the gold patch FAIL_TO_PASS still fail: {_names(f2p)}")
        if p2p:
            reasons.append(f"with the gold patch PASS_TO_PASS fail: {_names(p2p)}")
    return out


def check_instance(
    instance: Instance,
    *,
    open_image: OpenImage,
    recipes: Mapping[str, Any] | None = None,
    rebuild: bool = False,
    timeout: int = 1800,
    out_dir: str | Path | None = None,
    log: Log = _quiet,
) -> dict[str, Any]:
    """Build and grade one instance twice, each time in a fresh sandbox `open_image(tag)` of the built
    image; returns {check: bool, 'ok', 'reasons', 'spec', ...}."""
    from kvagent.evals.images import build_instance_image, image_environment
    from kvagent.evals.recipe import load_recipes, recipe_for
    from kvagent.evals.recipe_steps import describe, steps_of
    from kvagent.evals.specs import harness_spec

    started = time.monotonic()
    recipes = load_recipes() if recipes is None else recipes
    report: dict[str, Any] = {"instance_id": instance.instance_id, **dict.fromkeys(CHECKS), "reasons": []}
    logs = Path(out_dir) / instance.instance_id if out_dir is not None else None
    try:
        recipe = recipe_for(instance.instance_id, recipes)
        report["source"] = recipe.source_label()
        spec = harness_spec(instance, log)
        report["spec"] = {
            "origin": spec.origin if spec else None,
            "test_command": spec.test_command if spec else recipe.test_cmd,
            **describe(steps_of(recipe), spec),
        }
        if spec is None:
            report["reasons"].append(
                "swebench has no spec for this repo/version; graded with the recipe's test_cmd"
            )
        try:
            tag = build_instance_image(instance, recipes=recipes, rebuild=rebuild, log=log)
        except KvagentError as e:
            report["builds"] = False
            report["reasons"].append(f"build: {e}")
            return report
        report["builds"], report["image"] = True, tag
        report["environment"] = image_environment(tag)
        log(f"{instance.instance_id}: grading the empty patch")
        empty = _grade(instance, "", open_image, tag, recipes, timeout, logs / "empty" if logs else None)
        log(f"{instance.instance_id}: grading the gold patch")
        gold = _grade(
            instance, instance.patch, open_image, tag, recipes, timeout, logs / "gold" if logs else None
        )
        verdict = judge(empty, gold)
        report["reasons"] += verdict.pop("reasons")
        report.update(verdict)
    except KvagentError as e:
        report["reasons"].append(str(e))
    finally:
        report["ok"] = all(report.get(c) is True for c in CHECKS)
        report["duration_s"] = round(time.monotonic() - started, 1)
    return report


def check_instances(instances: Iterable[Instance], log: Log = _quiet, **kw: Any) -> list[dict[str, Any]]:
    return [check_instance(inst, log=log, **kw) for inst in instances]


def format_report(report: Mapping[str, Any]) -> str:
    """One line per instance, then its reasons: `ID  builds ✓  f2p_fail_before ✓ ...`."""
    mark = {True: "yes", False: "NO", None: "-"}
    cells = "  ".join(f"{c} {mark[report.get(c)]}" for c in CHECKS)
    head = f"{report['instance_id']}  {cells}  => {'verified' if report.get('ok') else 'NOT verified'}"
    notes = [report["environment"]] if report.get("environment") else []
    return "\n".join([head, *(f"    {r}" for r in [*notes, *report.get("reasons", [])])])
