"""The SWE-bench harness's rules, without Docker: which files a patch touches and which tests to run,
the eval script's shape, the log parser of a repository, and swebench's own verdict on a test log
(`get_eval_report`: every FAIL_TO_PASS and PASS_TO_PASS test must pass)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from kvagent.errors import KvagentError
from kvagent.evals.datasets import Instance

WORKDIR = "/testbed"
SCRATCH = "/tmp/kvagent-grade"
TEST_PATCH_FAILED_RC = 97  # eval script's own exit code: test_patch did not apply


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


def _resolves(name: str, status_map: dict[str, str]) -> bool:
    """Whether the log has a result for `name`, matched as swebench's grading matches it (exactly,
    or a truncated parametrized id by prefix)."""
    try:
        from swebench.harness.grading import _resolve_case
    except ImportError:  # another swebench 5.x: exact names only
        return name in status_map
    return _resolve_case(name, status_map) is not None


def judge_log(instance: Instance, model_patch: str, log_path: Path) -> dict[str, Any]:
    """swebench's verdict on a test log: {'resolved', 'patch_successfully_applied', 'tests_status',
    ...}, plus `missing_tests`: the FAIL_TO_PASS and PASS_TO_PASS names the log has no result for.

    The log is first respelt to the dataset's test names where only the interpreter's format differs
    (`test_names.py`); the file at `log_path` is left as the tests wrote it."""
    import tempfile

    from swebench.harness.constants import FAIL_ONLY_REPOS, EvalType
    from swebench.harness.grading import get_eval_report, get_logs_eval
    from swebench.types import TestSpec

    from kvagent.evals.test_names import normalise_log

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
    names = [*instance.FAIL_TO_PASS, *instance.PASS_TO_PASS]
    text = Path(log_path).read_text(errors="replace")
    with tempfile.TemporaryDirectory(prefix="kvagent-judge-") as tmp:
        normalised = Path(tmp) / "test_output.txt"
        normalised.write_text(normalise_log(text, names))
        verdict = get_eval_report(spec, pred, str(normalised), include_tests_status=True)[
            instance.instance_id
        ]
        status_map, _ = get_logs_eval(spec, str(normalised))
    verdict["missing_tests"] = [n for n in names if not _resolves(n, status_map)]
    return verdict
