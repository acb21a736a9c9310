#!/usr/bin/env python3
"""search (r2egym profile): R2E-Gym's search tool. In a directory: per-file counts of lines holding
the literal term, over non-hidden `.py` files only (its --python_only defaults to on and any value
given keeps it on), listed in walk order as ./relative paths; more than 100 files gives one line
asking to narrow the search. In a file: `grep -n` (the term is a grep pattern there).

Stdlib only (plus _r2e.py beside it), python >= 3.6 (R2E images' task interpreter).
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _r2e import argv, captured, emit  # noqa: E402

MAX_FILES = 100


def in_directory(term, directory, python_only):
    directory = os.path.realpath(directory)
    if not os.path.isdir(directory):
        emit(f"Directory '{directory}' not found or not a directory.\n")
        return 1
    counts = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            if name.startswith(".") or (python_only and not name.endswith(".py")):
                continue
            path = os.path.join(root, name)
            try:
                with open(path, errors="ignore") as f:
                    n = sum(1 for line in f if term in line)
            except (UnicodeDecodeError, PermissionError):
                continue
            if n:
                counts.append((path, n))
    if not counts:
        emit(f'No matches found for "{term}" in {directory}\n')
        return 0
    if len(counts) > MAX_FILES:
        # R2E-Gym says "More than N" with N the number of files that matched.
        emit(
            f'More than {len(counts)} files matched for "{term}" in {directory}. Please narrow your search.\n'
        )
        return 0
    lines = [f'Found {sum(n for _, n in counts)} matches for "{term}" in {directory}:']
    for path, n in counts:
        rel = os.path.relpath(path, start=os.getcwd())
        lines.append("{} ({} matches)".format(rel if rel.startswith("./") else "./" + rel, n))
    lines.append(f'End of matches for "{term}" in {directory}')
    emit("\n".join(lines) + "\n")
    return 0


def in_file(term, path):
    path = os.path.realpath(path)
    if not os.path.isfile(path):
        emit(f"File '{path}' not found or is not a file.\n")
        return 1
    code, out, err = captured(["grep", "-n", term, path])
    if code == 1:
        emit(f'No matches found for "{term}" in {path}\n')
        return 0
    if code != 0:
        emit(f"Error executing grep:\n{err}\n")
        return code
    emit(f'Matches for "{term}" in {path}:\n{out.strip()}\n')
    return 0


def main():
    parser = argparse.ArgumentParser(prog="search", description="Search for a term in files.")
    parser.add_argument("--search_term", required=True)
    parser.add_argument("--path", default=".")
    parser.add_argument("--python_only", default=True)
    args = parser.parse_args(argv())
    if os.path.isfile(args.path):
        return in_file(args.search_term, args.path)
    return in_directory(args.search_term, args.path, args.python_only)


if __name__ == "__main__":
    sys.exit(main())
