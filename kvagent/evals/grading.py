"""Grade predictions the way the SWE-bench harness does, in a fresh container per prediction.

Order (as `swebench.harness.run_evaluation`): apply the model patch (`git apply --verbose`, then
`--3way`, then `--reject`, then `patch --batch --forward --fuzz=5 -p1`, from a clean tree each time),
then run the harness's own eval script for the instance (`specs.py`: swebench's spec for its repo
and version, adapted to the sandbox), which resets the test files, applies `test_patch` and runs the
spec's test command on the spec's directives; and judge the log with swebench's own log parser and
grading rules (`get_eval_report`: every FAIL_TO_PASS and PASS_TO_PASS test must pass). Instances
swebench has no spec for run the recipe's test command on the test files (`eval_script` below).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
import tarfile
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kvagent.errors import KvagentError
from kvagent.evals.datasets import Instance, load_instances, select_instances
from kvagent.evals.images import docker_client, image_for, instance_image_tag, load_recipes, repo_test_command
from kvagent.evals.specs import TEST_PATCH_FAILED, sandbox_eval_script
from kvagent.fileio import atomic_write_json, atomic_write_text

WORKDIR = "/testbed"
SCRATCH = "/tmp/kvagent-grade"
DEFAULT_TIMEOUT_S = 1800
# swebench's harness tries these in turn (harness/run_evaluation.py GIT_APPLY_CMDS).
APPLY_COMMANDS = (
    "git apply --verbose",
    "git apply --verbose --3way",
    "git apply --verbose --reject",
    "patch --batch --forward --fuzz=5 -p1 -i",
)
TEST_PATCH_FAILED_RC = 97  # eval script's own exit code: test_patch did not apply

Log = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


# ----------------------------------------------------------------------------------------- pure helpers


def patch_files(patch: str) -> list[str]:
    """Files a unified git diff touches (new path of each `diff --git a/X b/Y` header), in order."""
    out = []
    for m in re.finditer(r"^diff --git a/(\S+) b/(\S+)$", patch, flags=re.M):
        if m.group(2) not in out:
            out.append(m.group(2))
    return out


def patch_test_targets(test_patch: str) -> list[str]:
    """The test files to run: what `test_patch` touches, minus data files (swebench's NON_TEST_EXTS)."""
    from swebench.harness.constants import NON_TEST_EXTS

    return [f for f in patch_files(test_patch) if not any(f.endswith(ext) for ext in NON_TEST_EXTS)]


def log_parser_name(instance: Instance) -> str:
    """Key in swebench's PARSER_REGISTRY for the instance's repository."""
    from swebench.harness.log_parsers import PARSER_REGISTRY
    from swebench.harness.log_parsers.python import MAP_REPO_TO_PARSER_PY

    named = instance.extra.get("log_parser")
    if isinstance(named, str) and named in PARSER_REGISTRY:
        return named
    parser = MAP_REPO_TO_PARSER_PY.get(instance.repo)
    if parser is None:
        raise KvagentError(
            f"swebench has no log parser for repository {instance.repo} ({instance.instance_id})"
        )
    names = [n for n, fn in PARSER_REGISTRY.items() if fn is parser]
    short = instance.repo.split("/")[-1].replace("-", "_").lower()
    # Several names alias one function; prefer the repo's own name for readable reports.
    return next((n for n in names if short in n), names[0])


def eval_script(instance: Instance, test_cmd: str, workdir: str = WORKDIR, scratch: str = SCRATCH) -> str:
    """Shell script run in the container after the model patch: swebench's eval.sh shape."""
    from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT, TEST_EXIT_CODE

    touched = " ".join(shlex.quote(f) for f in patch_files(instance.test_patch))
    directives = " ".join(shlex.quote(f) for f in patch_test_targets(instance.test_patch))
    # Reset what test_patch touches to the base commit (the model may have edited tests), files new in
    # test_patch are removed so it applies cleanly.
    reset = (
        f"for f in {touched}; do\n"
        '  if git cat-file -e "HEAD:$f" 2>/dev/null; then git checkout -q HEAD -- "$f"; else rm -f -- "$f"; fi\n'
        "done\n"
    )
    return (
        "#!/bin/bash\n"
        "set -uo pipefail\n"
        f"cd {shlex.quote(workdir)}\n"
        f"{reset}"
        f"git apply --verbose {shlex.quote(scratch)}/test.diff || exit {TEST_PATCH_FAILED_RC}\n"
        f"echo '{START_TEST_OUTPUT}'\n"
        f"{test_cmd} {directives}\n"
        "rc=$?\n"
        f"echo '{END_TEST_OUTPUT}'\n"
        f"echo '{TEST_EXIT_CODE}: '$rc\n"
        f"{reset}"
    )


def judge_log(instance: Instance, model_patch: str, log_path: Path) -> dict[str, Any]:
    """swebench's verdict on a test log: {'resolved', 'patch_successfully_applied', 'tests_status', ...}."""
    from swebench.harness.constants import FAIL_ONLY_REPOS, EvalType
    from swebench.harness.grading import get_eval_report
    from swebench.types import TestSpec

    spec = TestSpec(
        instance_id=instance.instance_id,
        image="",
        eval_script_list=[],
        repo=instance.repo,
        version=instance.version,
        FAIL_TO_PASS=instance.FAIL_TO_PASS,
        PASS_TO_PASS=instance.PASS_TO_PASS,
        log_parser=log_parser_name(instance),
        eval_type=(EvalType.FAIL_ONLY if instance.repo in FAIL_ONLY_REPOS else EvalType.PASS_AND_FAIL).value,
    )
    pred = {"instance_id": instance.instance_id, "model_patch": model_patch, "model_name_or_path": "kvagent"}
    return get_eval_report(spec, pred, str(log_path), include_tests_status=True)[instance.instance_id]


# -------------------------------------------------------------------------------------------- container


class _ContainerTarget:
    """Where grading runs: a bare container from the docker SDK."""

    def __init__(self, container: Any) -> None:
        self.container, self.workdir, self.scratch = container, WORKDIR, SCRATCH

    def put(self, files: Mapping[str, str]) -> None:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for name, text in files.items():
                data = text.encode("utf-8")
                info = tarfile.TarInfo(name)
                info.size = len(data)
                info.mode = 0o644
                info.mtime = int(time.time())
                tar.addfile(info, io.BytesIO(data))
        self.container.exec_run(["mkdir", "-p", self.scratch])
        if not self.container.put_archive(self.scratch, buf.getvalue()):
            raise KvagentError(f"could not copy files into the grading container at {self.scratch}")

    def exec(self, cmd: str, timeout: int = DEFAULT_TIMEOUT_S) -> tuple[int, str]:
        res = self.container.exec_run(["/bin/bash", "-c", cmd], workdir=self.workdir)
        return res.exit_code, (res.output or b"").decode("utf-8", errors="replace")


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

    rc, output = target.exec(
        f"timeout -s KILL {int(timeout)} /bin/bash {shlex.quote(target.scratch)}/eval.sh", timeout + 30
    )
    with tempfile.TemporaryDirectory() as tmp:
        log_path = (logs or Path(tmp)) / "test_output.txt"
        atomic_write_text(log_path, output)
        if rc == TEST_PATCH_FAILED_RC or TEST_PATCH_FAILED in output:
            details["error"] = "test_patch did not apply on top of the model patch"
            return
        if rc == 137 and "Test Exit Code" not in output:
            details["error"] = f"tests timed out after {timeout} s"
            return
        verdict = judge_log(instance, patch, log_path)
    details["tests_status"] = verdict.get("tests_status")
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
        "error": None,
    }


def grade_in_sandbox(
    instance: Instance,
    model_patch: str | None,
    sandbox: Any,
    *,
    timeout: int = DEFAULT_TIMEOUT_S,
    log_dir: str | Path | None = None,
    recipes: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Grade one prediction in a kvagent Sandbox that is fresh at the base commit (local or docker)."""
    started = time.monotonic()
    patch = model_patch or ""
    if patch and not patch.endswith("\n"):
        patch += "\n"
    details = _new_details(instance, patch)
    logs = Path(log_dir) if log_dir is not None else None
    try:
        # A local sandbox must not reinstall the checkout into the user's own environment.
        run_install = type(sandbox).__name__ != "LocalSandbox"
        _grade_in(_SandboxTarget(sandbox), instance, patch, recipes, details, timeout, logs, run_install)
    except KvagentError as e:
        details["error"] = str(e)
    details["duration_s"] = round(time.monotonic() - started, 2)
    if logs is not None:
        atomic_write_json(logs / "details.json", details)
    return details


def grade_instance(
    instance: Instance,
    model_patch: str | None,
    *,
    image: str | None = None,
    client: Any = None,
    timeout: int = DEFAULT_TIMEOUT_S,
    log_dir: str | Path | None = None,
    recipes: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Grade one prediction; returns its details. `status` is `resolved`, `unresolved` or `error`
    (error: no image, a patch that does not apply, a timeout, a Docker failure; as the official
    harness, these are not resolved)."""
    import docker

    started = time.monotonic()
    client = client or docker_client()
    patch = model_patch or ""
    if patch and not patch.endswith("\n"):
        patch += "\n"  # git apply rejects a diff whose last line lacks its newline
    details = _new_details(instance, patch)
    logs = Path(log_dir) if log_dir is not None else None
    if logs is not None:
        logs.mkdir(parents=True, exist_ok=True)
        atomic_write_text(logs / "patch.diff", patch)
    container = None
    try:
        image = image or image_for(instance, client)
        details["image"] = image
        try:
            container = client.containers.run(
                image,
                entrypoint=["sleep", "infinity"],
                detach=True,
                network_mode="none",
                working_dir=WORKDIR,
                mem_limit="4g",
                pids_limit=4096,
                labels={"kvagent.role": "grade", "kvagent.instance_id": instance.instance_id},
            )
        except docker.errors.ImageNotFound:
            raise KvagentError(
                f"image {image} not found; build it with `kvagent images build --instances {instance.instance_id}`"
            ) from None
        except docker.errors.APIError as e:
            if "pull access denied" in str(e) or "not found" in str(e).lower():
                raise KvagentError(
                    f"image {image} is not available offline; build {instance_image_tag(instance.instance_id)} "
                    f"with `kvagent images build --instances {instance.instance_id}`"
                ) from None
            raise
        _grade_in(_ContainerTarget(container), instance, patch, recipes, details, timeout, logs)
        return details
    except KvagentError as e:
        details["error"] = str(e)
        return details
    except docker.errors.DockerException as e:
        details["error"] = f"docker: {(str(e).strip().splitlines() or [type(e).__name__])[0]}"
        return details
    finally:
        details["duration_s"] = round(time.monotonic() - started, 2)
        if container is not None:
            with contextlib.suppress(docker.errors.DockerException):
                container.remove(force=True)
        if logs is not None:
            atomic_write_json(logs / "details.json", details)


# ------------------------------------------------------------------------------------------ predictions


def load_predictions(path: str | Path) -> dict[str, dict[str, Any]]:
    """SWE-bench predictions (JSON list, JSON object keyed by id, or JSONL) keyed by instance id."""
    path = Path(path)
    if not path.is_file():
        raise KvagentError(f"predictions file not found: {path}")
    text = path.read_text(encoding="utf-8")
    records: list[Any]
    if path.suffix.lower() == ".jsonl":
        records = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise KvagentError(f"{path}:{lineno}: invalid JSON ({e.msg})") from None
    else:
        try:
            data = json.loads(text)
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
        if rec["instance_id"] in out:
            raise KvagentError(f"{path}: two predictions for {rec['instance_id']!r}; grade one run per file")
        out[rec["instance_id"]] = rec
    return out


def grade_predictions(
    predictions_path: str | Path,
    dataset_path: str | Path,
    instances: str | Sequence[str] | None = None,
    out_dir: str | Path = "grade-out",
    *,
    split: str = "test",
    timeout: int = DEFAULT_TIMEOUT_S,
    client: Any = None,
    log: Log = _quiet,
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
    client = client or docker_client()
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
        "empty_patch_instances": 0,
        "resolved_ids": [],
        "unresolved_ids": [],
        "error_ids": [],
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
            client=client,
            timeout=timeout,
            log_dir=out / "logs" / inst.instance_id,
        )
        report["instances"][inst.instance_id] = d
        report[f"{d['status']}_ids"].append(inst.instance_id)
        if d["patch_is_empty"]:
            report["empty_patch_ids"].append(inst.instance_id)
        if d["status"] != "error":
            report["completed_instances"] += 1
        for key in ("resolved", "unresolved", "error", "empty_patch"):
            report[f"{key}_instances"] = len(report[f"{key}_ids"])
        log(f"  {d['status']}" + (f": {d['error']}" if d["error"] else ""))
        atomic_write_json(out / "report.json", report)
    atomic_write_json(out / "report.json", report)
    return report


# ----------------------------------------------------------------------------- official harness


def official_harness_command(
    predictions: str,
    dataset: str,
    instance_ids: Sequence[str] | None,
    out_dir: str | Path,
    *,
    split: str = "test",
    timeout: int = DEFAULT_TIMEOUT_S,
    run_id: str = "kvagent",
    workers: int = 1,
) -> list[str]:
    """The swebench harness invocation for a predictions file (it pulls the official images)."""
    import sys

    cmd = [
        sys.executable, "-m", "swebench.harness.run_evaluation",
        "--dataset_name", str(dataset),
        "--split", split,
        "--predictions_path", str(predictions),
        "--run_id", run_id,
        "--timeout", str(timeout),
        "--max_workers", str(workers),
        "--report_dir", str(out_dir),
    ]  # fmt: skip
    if instance_ids:
        cmd += ["--instance_ids", *instance_ids]
    return cmd


def run_official_harness(
    predictions: str,
    dataset: str,
    instances: str | Sequence[str] | None,
    out_dir: str | Path,
    *,
    split: str = "test",
    timeout: int = DEFAULT_TIMEOUT_S,
) -> int:
    """Hand the predictions to swebench's own harness (needs Docker Hub for its images)."""
    import subprocess

    if predictions != "gold" and not Path(predictions).is_file():
        raise KvagentError(f"predictions file {predictions} not found; pass a JSONL/JSON file or `gold`")
    ids = None
    if instances is not None:
        ids = [i.instance_id for i in select_instances(load_instances(dataset, split=split), instances)]
    docker_client()  # a clear error now rather than a traceback from inside the harness
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    cmd = official_harness_command(predictions, dataset, ids, out_dir, split=split, timeout=timeout)
    return subprocess.run(cmd, cwd=out_dir).returncode
