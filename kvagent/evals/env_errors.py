"""When a test log says the tests could not run at all: an environment error, not a grade.

A missing runner (sympy's sdist has no `bin/test`: exit 127), a runner the interpreter cannot open,
or a test module that fails to import or collect as a whole leaves the instance's tests without
a result, and swebench's report then counts every one as failed: "unresolved", charged to the
policy, for a broken image. `could_not_run` names such a log; grading (`grading.py`) records it
apart, as an infrastructure error, once the gold patch shows the same in the same image (a model's
patch can break a module's import too, and that is a fair failure).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

# (what went wrong, pattern over the test output), first match wins; a pattern's group 1 names it.
SIGNATURES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (what, re.compile(pattern, re.M))
    for what, pattern in (
        (
            "test runner not found",
            r"^(?:\S+: )?(?:line \d+: )?(\S+): (?:command not found|No such file or directory)$",
        ),
        ("test runner not found", r"can't open file '([^']+)': \[Errno 2\] No such file or directory"),
        ("test runner not installed", r"^\S*python[\d.]*: No module named (\S+)$"),
        ("test module did not import", r"^ImportError: Failed to import test module: (\S+)"),
        ("test module did not collect", r"ERROR collecting (\S+)"),  # pytest: `____ ERROR collecting X ____`
        ("test module did not collect", r"^ImportError while importing test module '([^']+)'"),
        ("test module did not import", r"^(\S+\.py)\[\?\]\s+Failed to import"),  # sympy's bin/test
        ("a module the tests need is missing", r"^ModuleNotFoundError: No module named '([^']+)'"),
    )
)
# Exit statuses of a command the shell could not run (126: not executable, 127: not found).
SHELL_CANNOT_RUN = (126, 127)


def _test_output(log: str) -> str:
    from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT

    if START_TEST_OUTPUT in log:
        return log.split(START_TEST_OUTPUT, 1)[1].split(END_TEST_OUTPUT, 1)[0]
    return log


def could_not_run(log: str, missing: Sequence[str], total: int) -> str | None:
    """Why the tests could not run (e.g. `test runner not found: bin/test (exit 127)`), or None when
    they ran: every one of the `total` FAIL_TO_PASS / PASS_TO_PASS names has a result (`missing`
    empty), or nothing in the log says why some have none."""
    if not missing or total == 0:
        return None
    from swebench.harness.grading import parse_test_exit_code

    code = parse_test_exit_code(log)
    body = _test_output(log)
    reason = next(
        (f"{what}: {m.group(1)}" for what, pattern in SIGNATURES if (m := pattern.search(body))), None
    )
    if reason is None and code in SHELL_CANNOT_RUN:
        reason = "the test command could not be run"
    if reason is None:
        return None
    return reason + (f" (exit {code})" if code is not None else "")
