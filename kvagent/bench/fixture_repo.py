"""A small Python package with one bug and its tests, written on the fly so generated episodes need
no network: `durations` parses strings like "1h30m" and formats seconds back."""

from __future__ import annotations

from pathlib import Path

FILES = {
    "README.md": """# durations

Parse human durations ("1h30m", "45s", "2d") into seconds and format seconds back.

    >>> from durations import parse_duration, format_duration
    >>> parse_duration("1h30m")
    5400
    >>> format_duration(5400)
    '1h30m'

Run the tests with `python -m unittest -v`.
""",
    "setup.cfg": """[metadata]
name = durations
version = 0.3.1

[options]
packages = durations
python_requires = >=3.8
""",
    "durations/__init__.py": '''"""Parse and format human durations."""

from durations.format import format_duration
from durations.parse import UNITS, parse_duration

__all__ = ["UNITS", "format_duration", "parse_duration"]
''',
    "durations/parse.py": '''"""Turn "1h30m" into 5400."""

import re

UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_PART = re.compile(r"(\\d+)([dhms])")


class DurationError(ValueError):
    """The text is not a duration."""


def parse_duration(text):
    """Seconds in `text`, a sequence of NUMBER+UNIT parts (units d, h, m, s)."""
    text = text.strip().lower()
    if not text:
        raise DurationError("empty duration")
    pos = 0
    total = 0
    for match in _PART.finditer(text):
        if match.start() != pos:
            raise DurationError(f"unexpected text at {pos}: {text[pos:]!r}")
        value, unit = match.groups()
        total = int(value) * UNITS[unit]
        pos = match.end()
    if pos != len(text):
        raise DurationError(f"trailing text: {text[pos:]!r}")
    return total
''',
    "durations/format.py": '''"""Turn 5400 into "1h30m"."""

from durations.parse import UNITS


def format_duration(seconds):
    """The shortest NUMBER+UNIT form of a non-negative number of seconds."""
    if seconds < 0:
        raise ValueError("negative duration")
    if seconds == 0:
        return "0s"
    parts = []
    for unit, size in UNITS.items():
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)
''',
    "durations/cli.py": '''"""`python -m durations.cli 1h30m` prints 5400."""

import sys

from durations.parse import DurationError, parse_duration


def main(argv=None):
    args = sys.argv[1:] if argv is None else argv
    status = 0
    for arg in args:
        try:
            print(parse_duration(arg))
        except DurationError as e:
            print(f"error: {e}", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
''',
    "tests/__init__.py": "",
    "tests/test_parse.py": """import unittest

from durations.parse import DurationError, parse_duration


class ParseTest(unittest.TestCase):
    def test_single_unit(self):
        self.assertEqual(parse_duration("45s"), 45)
        self.assertEqual(parse_duration("2d"), 172800)

    def test_compound(self):
        self.assertEqual(parse_duration("1h30m"), 5400)
        self.assertEqual(parse_duration("1d2h3m4s"), 93784)

    def test_case_and_spaces(self):
        self.assertEqual(parse_duration(" 10M "), 600)

    def test_errors(self):
        for bad in ("", "abc", "10x", "5m!"):
            with self.assertRaises(DurationError):
                parse_duration(bad)


if __name__ == "__main__":
    unittest.main()
""",
    "tests/test_format.py": """import unittest

from durations.format import format_duration


class FormatTest(unittest.TestCase):
    def test_zero(self):
        self.assertEqual(format_duration(0), "0s")

    def test_compound(self):
        self.assertEqual(format_duration(5400), "1h30m")
        self.assertEqual(format_duration(93784), "1d2h3m4s")

    def test_negative(self):
        with self.assertRaises(ValueError):
            format_duration(-1)


if __name__ == "__main__":
    unittest.main()
""",
}

ISSUE = """parse_duration ignores all but the last part of a compound duration

`parse_duration("1h30m")` returns 1800 instead of 5400, and `parse_duration("1d2h3m4s")` returns 4.
Single-unit durations such as "45s" work. Expected: the parts are added up."""

BUGGY_LINE = "        total = int(value) * UNITS[unit]"
FIXED_LINE = "        total += int(value) * UNITS[unit]"


def write_fixture_repo(root: str | Path) -> Path:
    root = Path(root)
    for rel, text in FILES.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
    return root
