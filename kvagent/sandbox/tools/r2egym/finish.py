#!/usr/bin/env python3
"""finish (r2egym profile): `submit` prints the finished marker; anything else is refused.

Stdlib only (plus _r2e.py beside it), python >= 3.6 (R2E images' task interpreter). Behaves as
R2E-Gym's finish tool.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _r2e import argv, emit  # noqa: E402


def main():
    parser = argparse.ArgumentParser(prog="finish", description="End the episode with `submit`.")
    parser.add_argument("command")
    parser.add_argument("--result", default="")
    args = parser.parse_args(argv())
    if args.command != "submit":
        emit(f"Unknown command '{args.command}'. Only `submit` is supported.\n")
        return 1
    emit("<<<Finished>>>\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
