#!/usr/bin/env python3
"""finish: end the episode. `command` must be `submit`; `result` is an optional summary.

Stdlib only (plus _toolkit.py beside it), python >= 3.7. Prints the finished marker the agent
loop watches for.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # even under PYTHONSAFEPATH / -P
from _toolkit import emit, fail, load_params  # noqa: E402

MARKER = "<<<Finished>>>"


def main():
    try:
        params = load_params(sys.argv[1:], strict=False)  # stray arguments are ignored here
    except (OSError, ValueError) as e:
        return fail(f"cannot read parameters: {e}")
    command = str(params.get("command", "submit")).strip() or "submit"
    if command != "submit":
        return fail(f"unknown command {command!r}; finish only accepts command=submit")
    emit(MARKER + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
