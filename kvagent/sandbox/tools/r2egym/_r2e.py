"""Shared piece of the r2egym tool scripts: the call's parameters turned into the argument list
R2E-Gym's runtime gives its tools (`NAME [COMMAND] --key value ...`: the `command` parameter first
and bare, every other one as `--key value` in the order the model wrote them), so each script's
argparse accepts and refuses exactly what R2E-Gym's does.

Stdlib only, python >= 3.6 (R2E images' task interpreter). Not a tool: the scripts import it from
their own directory; the parameters arrive as for kvagent's tools (see ../_toolkit.py).
"""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # ../_toolkit.py
from _toolkit import emit, load_params  # noqa: E402

__all__ = ["argv", "captured", "emit", "state_path"]


def argv():
    """The tool's argument list from the call's parameters (R2E-Gym's `Action.to_bashcmd` order)."""
    params = load_params(sys.argv[1:], strict=False)
    out = []
    if "command" in params:
        out.append(str(params["command"]))
    for key, value in params.items():
        if key != "command":
            out += ["--" + key, str(value)]
    return out


def state_path(name):
    """A file in the sandbox's state dir (R2E-Gym keeps its editor state in /var/tmp)."""
    state = os.environ.get("KVAGENT_STATE_DIR") or "/tmp/kvagent_state"
    os.makedirs(state, exist_ok=True)
    return os.path.join(state, name)


def captured(cmd):
    """(exit status, stdout, stderr) of `cmd` as text; python 3.6 has no capture_output / text."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    out, err = proc.communicate()
    return proc.returncode, out, err
