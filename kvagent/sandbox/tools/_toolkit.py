"""Shared pieces of the tool scripts: parameters, output and the error wrapper.

Stdlib only, python >= 3.6 (the r2egym scripts import it and run under old task images' own
interpreter). Not a tool: the scripts import it from their own directory, where both sandbox
backends install it next to them.
"""

import contextlib
import json
import os
import sys


class ToolError(Exception):
    """A problem the model can fix; printed as `ERROR: <message>` with exit code 1."""


ERRORS = (ToolError, OSError, ValueError)  # what run_tool reports as `ERROR: ...` by default


def load_params(argv, strict=True):
    """Parameters from `--key value` pairs, then $KVAGENT_TOOL_PARAMS, then `--params-file FILE`.

    Both the variable and the file hold a JSON object; the file is deleted once read. With
    strict=False, malformed arguments are skipped pairwise instead of raising ToolError.
    """
    params = {}
    i = 0
    while i < len(argv):
        key = argv[i]
        if key.startswith("--") and i + 1 < len(argv):
            params[key[2:]] = argv[i + 1]
        elif strict:
            raise ToolError("bad arguments; use --params-file FILE or --key value pairs")
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


def emit(text):
    """Print text as UTF-8 whatever the locale (undecodable characters are replaced)."""
    sys.stdout.buffer.write(text.encode("utf-8", "replace"))
    sys.stdout.buffer.flush()


def fail(message):
    """Print `ERROR: <message>` and return the exit code 1."""
    emit(f"ERROR: {message}\n")
    return 1


def run_tool(tool, errors=ERRORS):
    """Exit code of tool(params) (None counts as 0) with the parameters from sys.argv and the
    environment; one of `errors`, raised while reading them or by the tool, is printed by fail()."""
    try:
        return tool(load_params(sys.argv[1:])) or 0
    except errors as e:
        return fail(e)
