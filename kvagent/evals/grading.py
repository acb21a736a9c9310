"""Grade predictions the way the SWE-bench harness does, each in a fresh sandbox at the base commit
(a container of the instance's image, or a local copy).

Order (as `swebench.harness.run_evaluation`): apply the model patch (`git apply --verbose`, then
`--3way`, then `--reject`, then `patch --batch --forward --fuzz=5 -p1`, from a clean tree each time),
then run the harness's own eval script for the instance (`specs.py`: swebench's spec for its repo
and version, adapted to the sandbox), which resets the test files, applies `test_patch` and runs the
spec's test command on the spec's directives; and judge the log with swebench's own log parser and
grading rules (`judging.py`). Instances swebench has no spec for run the recipe's test command on
the test files (`judging.eval_script`).

A grade is `resolved`, `unresolved`, `error` (the patch did not apply, a timeout, no usable output)
or `env_error`: the tests could not run at all (`env_errors.py`: a missing runner, a module that
does not import), and the gold patch, run as a control in the same image, cannot run them either;
that is the image's fault, recorded apart like an infrastructure error, never charged to a patch.
"""

from __future__ import annotations

import json
import shlex
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from kvagent.errors import KvagentError
from kvagent.evals.datasets import Instance, load_instances, select_instances
from kvagent.evals.env_errors import could_not_run
from kvagent.evals.images import image_environment
from kvagent.evals.judging import TEST_PATCH_FAILED_RC, eval_script, judge_log
from kvagent.evals.recipe import load_recipes, repo_test_command
from kvagent.evals.specs import TEST_PATCH_FAILED, sandbox_eval_script
from kvagent.fileio import atomic_write_json, atomic_write_text, read_jsonl

DEFAULT_TIMEOUT_S = 1800
# swebench's harness tries these in turn (harness/run_evaluation.py GIT_APPLY_CMDS).
APPLY_COMMANDS = (
    "git apply --verbose",
    "git apply --verbose --3way",
    "git apply --verbose --reject",
    "patch --batch --forward --fuzz=5 -p1 -i",
)

Log = Callable[[str], None]
# A fresh sandbox for grading an instance, e.g. a container of its image (`kvagent.cli.environments`).
OpenEnv = Callable[[Instance], AbstractContextManager[Any]]


def _quiet(_: str) -> None:
    pass


class _SandboxTarget:
    """Where grading runs: a kvagent Sandbox (local copy or container) fresh at the base commit."""

    def __init__(self, sandbox: Any) -> None:
        self.sandbox = sandbox
        self.workdir = str(sandbox.workdir)
        # Inside the checkout, so every backend may write there; the eval script never stages it.
        self.scratch = f"{self.workdir}/.kvagent-grade"

    def put(self, files: Mapping[str, str]) -> None:
        for name, text in files.items():
            self.sandbox.write(f"{self.scratch}/{name}", text)

    def exec(self, cmd: str, timeout: int = DEFAULT_TIMEOUT_S) -> tuple[int, str]:
        res = self.sandbox.run(
            f"cd {shlex.quote(self.workdir)} && {cmd}", timeout=timeout, max_output=32 << 20
        )
        return res.exit_code, res.output


def _apply_model_patch(target: Any) -> tuple[str | None, str]:
    """Try each apply command from a clean tree; returns (command that worked or None, last output)."""
    output = ""
    diff = shlex.quote(f"{target.scratch}/model.diff")
    for attempt, cmd in enumerate(APPLY_COMMANDS):
        if attempt:
            # --reject and patch leave partial edits behind; start each try from the base tree.
            target.exec("git checkout -q -- . && git clean -fdq -e .kvagent-grade")
        rc, output = target.exec(f"{cmd} {diff}")
        if rc == 0:
            return cmd, output
    # The chain can apply the patch fully while each command still exits non-zero.
    rc, _ = target.exec(f"git apply --check --reverse {diff}")
    if rc == 0:
        return "already applied", output
    return None, output


def _script_for(target: Any, instance: Instance, recipes: Mapping[str, Any] | None, run_install: bool) -> str:
    """swebench's eval script for the instance; the recipe's test command where it has no spec."""
    recipes = load_recipes() if recipes is None else recipes
    if isinstance(instance.extra.get("test_cmd"), str):  # a record that names its own test command
        return eval_script(instance, instance.extra["test_cmd"], target.workdir, target.scratch)
    recipe = recipes.get(instance.instance_id)
    steps = getattr(recipe, "steps", None)
    script = sandbox_eval_script(instance, target.workdir, steps=steps, run_install=run_install)
    return script or eval_script(
        instance, repo_test_command(instance, recipes), target.workdir, target.scratch
    )


def _run_tests(target: Any, instance: Instance, patch: str, timeout: int, log_path: Path) -> tuple[str, Any]:
    """Run the eval script once; ("error message", None) or ("", swebench's verdict)."""
    rc, output = target.exec(
        f"timeout -s KILL {int(timeout)} /bin/bash {shlex.quote(target.scratch)}/eval.sh", timeout + 30
    )
    atomic_write_text(log_path, output)
    if rc == TEST_PATCH_FAILED_RC or TEST_PATCH_FAILED in output:
        return "test_patch did not apply on top of the model patch", None
    if rc == 137 and "Test Exit Code" not in output:
        return f"tests timed out after {timeout} s", None
    verdict = judge_log(instance, patch, log_path)
    n = len(instance.FAIL_TO_PASS) + len(instance.PASS_TO_PASS)
    verdict["could_not_run"] = could_not_run(output, verdict["missing_tests"], n)
    return "", verdict


def _gold_control(target: Any, instance: Instance, timeout: int, log_path: Path) -> str | None:
    """The gold patch in the same sandbox, from the base tree: why the tests cannot run with it
    either, or None when they run (then it was the graded patch that broke them)."""
    target.exec("git checkout -q -- . && git clean -fdq -e .kvagent-grade")
    target.put({"model.diff": instance.patch if instance.patch.endswith("\n") else instance.patch + "\n"})
    applied, _ = _apply_model_patch(target)
    if applied is None:
        return "the gold patch does not apply in this image"
    error, verdict = _run_tests(target, instance, instance.patch, timeout, log_path)
    return error or verdict["could_not_run"]


def _grade_in(
    target: Any,
    instance: Instance,
    patch: str,
    recipes: Mapping[str, Any] | None,
    details: dict[str, Any],
    timeout: int,
    logs: Path | None,
    run_install: bool = True,
) -> None:
    """Apply the model patch, run the tests, and fill `details` with swebench's verdict."""
    empty = not patch.strip()
    script = _script_for(target, instance, recipes, run_install)
    target.put({"model.diff": patch, "test.diff": instance.test_patch, "eval.sh": script})

    if not empty:
        applied, apply_out = _apply_model_patch(target)
        details["apply_command"] = applied
        details["patch_applied"] = applied is not None
        if logs is not None:
            atomic_write_text(logs / "apply.log", apply_out)
        if applied is None:
            last = [ln for ln in apply_out.strip().splitlines() if ln.strip()]
            details["error"] = f"model patch did not apply: {last[-1] if last else 'no output'}"
            return

    with tempfile.TemporaryDirectory() as tmp:
        log_dir = logs or Path(tmp)
        error, verdict = _run_tests(target, instance, patch, timeout, log_dir / "test_output.txt")
        if error:
            details["error"] = error
            return
        broken = verdict["could_not_run"]
        # A record without a gold patch has no control: what the log says stands.
        if broken and instance.patch.strip() and patch.strip() != instance.patch.strip():
            broken = _gold_control(target, instance, timeout, log_dir / "gold_control_output.txt")
            details["gold_control"] = "tests cannot run" if broken else "tests run"
    details["tests_status"] = verdict.get("tests_status")
    details["missing_tests"] = verdict["missing_tests"]
    if broken:
        details["status"] = "env_error"
        details["env_error"] = broken
        details["error"] = f"environment error: {broken}"
        details["infra"] = True  # the image's fault: recorded apart, never a patch's failure
        return
    if not verdict.get("patch_successfully_applied"):
        # get_logs_eval found no usable test output (crash, collection error, exit-code mismatch).
        details["error"] = "no usable test output" + (
            f" ({verdict['infra_failure_reason']})" if verdict.get("infra_failure_reason") else ""
        )
        return
    details["resolved"] = bool(verdict.get("resolved"))
    details["status"] = "resolved" if details["resolved"] else "unresolved"


def _new_details(instance: Instance, patch: str) -> dict[str, Any]:
    return {
        "instance_id": instance.instance_id,
        "image": None,
        "status": "error",
        "resolved": False,
        "patch_is_empty": not patch.strip(),
        "patch_applied": None,
        "apply_command": None,
        "tests_status": None,
        "missing_tests": None,
        "error": None,
        "env_error": None,
        "environment": None,
    }


def grade_instance(
    instance: Instance,
    model_patch: str | None,
    *,
    open_env: OpenEnv,
    timeout: int = DEFAULT_TIMEOUT_S,
    log_dir: str | Path | None = None,
    recipes: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Grade one prediction in the sandbox `open_env(instance)` gives (fresh at the base commit);
    returns its details. `status` is `resolved`, `unresolved`, `error` (no image, a patch that does
    not apply, a timeout, a sandbox failure; as the official harness, these are not resolved) or
    `env_error` (the tests could not run in this image, with the gold patch either). `environment`:
    `environment differs: python X.Y (spec A.B)` for an image on another Python than the spec's."""
    started = time.monotonic()
    patch = model_patch or ""
    if patch and not patch.endswith("\n"):
        patch += "\n"  # git apply rejects a diff whose last line lacks its newline
    details = _new_details(instance, patch)
    logs = Path(log_dir) if log_dir is not None else None
    if logs is not None:
        logs.mkdir(parents=True, exist_ok=True)
        atomic_write_text(logs / "patch.diff", patch)
    try:
        with open_env(instance) as sandbox:
            details["image"] = getattr(sandbox, "image", None)
            details["environment"] = image_environment(details["image"])
            # A local sandbox must not reinstall the checkout into the user's own environment.
            run_install = type(sandbox).__name__ != "LocalSandbox"
            _grade_in(_SandboxTarget(sandbox), instance, patch, recipes, details, timeout, logs, run_install)
    except KvagentError as e:
        details["error"] = str(e)
        details["infra"] = True  # no image, a sandbox that failed: not the patch's fault
    details["duration_s"] = round(time.monotonic() - started, 2)
    if logs is not None:
        atomic_write_json(logs / "details.json", details)
    return details


# ------------------------------------------------------------------------------------------ predictions


def load_predictions(path: str | Path) -> dict[str, dict[str, Any]]:
    """SWE-bench predictions (JSON list, JSON object keyed by id, or JSONL) keyed by instance id."""
    path = Path(path)
    if not path.is_file():
        raise KvagentError(f"predictions file not found: {path}")
    records: list[Any]
    if path.suffix.lower() == ".jsonl":
        records = [rec for _, rec in read_jsonl(path)]
    else:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise KvagentError(f"{path}:{e.lineno}: invalid JSON ({e.msg})") from None
        if isinstance(data, dict) and "instance_id" not in data:
            records = [{"instance_id": k, **v} if isinstance(v, dict) else v for k, v in data.items()]
        else:
            records = data if isinstance(data, list) else [data]
    out: dict[str, dict[str, Any]] = {}
    for i, rec in enumerate(records):
        if not isinstance(rec, dict) or not isinstance(rec.get("instance_id"), str):
            raise KvagentError(f"{path}: prediction {i} has no instance_id")
        if "model_patch" not in rec:
            raise KvagentError(f"{path}: prediction for {rec['instance_id']!r} lacks field 'model_patch'")
        if rec["model_patch"] is not None and not isinstance(rec["model_patch"], str):
            raise KvagentError(
                f"{path}: prediction for {rec['instance_id']!r} has a model_patch of type "
                f"{type(rec['model_patch']).__name__}; it must be a diff string (or null for none)"
            )
        if rec["instance_id"] in out:
            raise KvagentError(f"{path}: two predictions for {rec['instance_id']!r}; grade one run per file")
        out[rec["instance_id"]] = rec
    if not out:
        raise KvagentError(f"{path}: holds no predictions; pass a file with one per instance, or `gold`")
    return out


def grade_predictions(
    predictions_path: str | Path,
    dataset_path: str | Path,
    instances: str | Sequence[str] | None = None,
    out_dir: str | Path = "grade-out",
    *,
    split: str = "test",
    timeout: int = DEFAULT_TIMEOUT_S,
    open_env: OpenEnv,
    log: Log = _quiet,
    recipes: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Grade a predictions file (or `gold`: the dataset's own patches) and write `out_dir/report.json`
    (rewritten atomically after each instance). `instances` selects as `select_instances` does."""
    dataset = load_instances(dataset_path, split=split)
    selected = select_instances(dataset, instances) if instances is not None else dataset
    gold = str(predictions_path) == "gold"
    if gold:
        preds = {
            i.instance_id: {
                "instance_id": i.instance_id,
                "model_patch": i.patch,
                "model_name_or_path": "gold",
            }
            for i in selected
        }
    else:
        preds = load_predictions(predictions_path)
    known = {i.instance_id for i in dataset}
    unknown = sorted(set(preds) - known)
    if unknown:
        raise KvagentError(f"prediction for an instance not in {dataset_path}: {', '.join(unknown[:5])}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    todo = [i for i in selected if i.instance_id in preds]
    report: dict[str, Any] = {
        "dataset": str(dataset_path),
        "predictions": "gold" if gold else str(predictions_path),
        "model_name_or_path": sorted({str(p.get("model_name_or_path")) for p in preds.values()}),
        "total_instances": len(selected),
        "submitted_instances": len(todo),
        "completed_instances": 0,
        "resolved_instances": 0,
        "unresolved_instances": 0,
        "error_instances": 0,
        "env_error_instances": 0,
        "empty_patch_instances": 0,
        "resolved_ids": [],
        "unresolved_ids": [],
        "error_ids": [],
        "env_error_ids": [],
        "empty_patch_ids": [],
        "incomplete_ids": sorted(i.instance_id for i in selected if i.instance_id not in preds),
        "instances": {},
    }
    for n, inst in enumerate(todo, 1):
        pred = preds[inst.instance_id]
        log(f"[{n}/{len(todo)}] grading {inst.instance_id}")
        d = grade_instance(
            inst,
            pred.get("model_patch"),
            open_env=open_env,
            timeout=timeout,
            log_dir=out / "logs" / inst.instance_id,
            recipes=recipes,
        )
        report["instances"][inst.instance_id] = d
        report[f"{d['status']}_ids"].append(inst.instance_id)
        if d["patch_is_empty"]:
            report["empty_patch_ids"].append(inst.instance_id)
        if d["status"] not in ("error", "env_error"):
            report["completed_instances"] += 1
        for key in ("resolved", "unresolved", "error", "env_error", "empty_patch"):
            report[f"{key}_instances"] = len(report[f"{key}_ids"])
        log(f"  {d['status']}" + (f": {d['error']}" if d["error"] else ""))
        atomic_write_json(out / "report.json", report)
    atomic_write_json(out / "report.json", report)
    return report
