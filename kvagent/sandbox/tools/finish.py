#!/usr/bin/env python3
"""finish: end the episode. `command` must be `submit`; `result` is an optional summary.

Standalone, stdlib only, python >= 3.7. Prints the finished marker the agent loop watches for.
"""

import contextlib
import json
import os
import sys

MARKER = "<<<Finished>>>"


def load_params(argv):
    params = {}
    i = 0
    while i + 1 < len(argv):
        if argv[i].startswith("--"):
            params[argv[i][2:]] = argv[i + 1]
        i += 2
    blob = os.environ.pop("KVAGENT_TOOL_PARAMS", None)  # popped: commands must not inherit it
    if blob is not None:
        params.update(json.loads(blob))
    pfile = params.pop("params-file", None)
    if pfile is not None:
        with open(pfile, encoding="utf-8") as f:
            params.update(json.load(f))
        with contextlib.suppress(OSError):
            os.remove(pfile)
    return params


def main():
    try:
        params = load_params(sys.argv[1:])
    except (OSError, ValueError) as e:
        sys.stdout.write(f"ERROR: cannot read parameters: {e}\n")
        return 1
    command = str(params.get("command", "submit")).strip() or "submit"
    if command != "submit":
        sys.stdout.write(f"ERROR: unknown command {command!r}; finish only accepts command=submit\n")
        return 1
    sys.stdout.write(MARKER + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
