"""Test names across interpreters: a log rewritten to the dataset's spelling of each test before
swebench's parser and report read it.

An instance's FAIL_TO_PASS / PASS_TO_PASS names were recorded under one interpreter, and some
runners print a test's name differently under another. Known formats (one function each, applied
in turn; both directions, so a log from an older Python also matches names recorded on a newer one):

  unittest_qualified   since Python 3.11 `str(TestCase)` ends with the method's qualified name:
                       `test_x (pkg.mod.Class.test_x)` where 3.10 and earlier print
                       `test_x (pkg.mod.Class)`. Django's runtests.py lines (`... ok`,
                       `FAIL: `, `ERROR: `, subtests) carry that text.

Only names of the instance are rewritten, and only to the dataset's own spelling, so a log that
already matches is left as it is.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

# `method (dotted.path)`: the head of a unittest description, in a log line or a dataset name.
_UNITTEST = re.compile(r"(?<![\w.])([A-Za-z_]\w*) \(([A-Za-z_][\w.]*)\)")


def unittest_qualified(head: str) -> str | None:
    """The pre-3.11 spelling of a unittest description head (`m (a.B.m)` -> `m (a.B)`), or None
    when `head` is not one."""
    m = _UNITTEST.fullmatch(head)
    if not m:
        return None
    method, path = m.groups()
    if path.endswith("." + method):
        path = path[: -len(method) - 1]
    return f"{method} ({path})"


# Each format: (its pattern over log text and names, the canonical spelling of a match).
FORMATS: tuple[tuple[re.Pattern[str], Callable[[str], str | None]], ...] = ((_UNITTEST, unittest_qualified),)


def normalise_log(text: str, names: Iterable[str]) -> str:
    """`text` with every test name of a known format spelt as in `names` (the instance's
    FAIL_TO_PASS and PASS_TO_PASS) where only the interpreter's format differs."""
    names = list(names)
    for pattern, canonical in FORMATS:
        wanted: dict[str, str] = {}  # canonical head -> the dataset's head
        for name in names:
            for m in pattern.finditer(name):
                key = canonical(m.group(0))
                if key is not None:
                    wanted.setdefault(key, m.group(0))
        if not wanted:
            continue

        def respell(m: re.Match[str], wanted: dict[str, str] = wanted, canonical=canonical) -> str:
            return wanted.get(canonical(m.group(0)) or "", m.group(0))

        text = pattern.sub(respell, text)
    return text
