#!/usr/bin/env python3
"""search: find a literal term in a file (matching lines) or a directory (matching files).

Stdlib only (plus _toolkit.py beside it), python >= 3.7. Parameters: `search_term`, `path`
(default `.`). Hidden files and directories are skipped, as are binary files.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # even under PYTHONSAFEPATH / -P
from _toolkit import ToolError, emit, run_tool  # noqa: E402

MAX_FILES = 100
MAX_LINES = 200
MAX_LINE_CHARS = 300


def file_lines(path):
    """Decoded lines of a text file, or None for binary/unreadable files."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if b"\0" in data[:8192]:
        return None
    return data.decode("utf-8", "replace").splitlines()


def search_dir(term, root):
    counts = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if not x.startswith("."))
        for name in sorted(files):
            if name.startswith("."):
                continue
            full = os.path.join(d, name)
            lines = file_lines(full)
            if lines is None:
                continue
            n = sum(1 for line in lines if term in line)
            if n:
                counts.append((full, n))
    if not counts:
        return f'No matches found for "{term}" in {root}\n'
    if len(counts) > MAX_FILES:
        return (
            f'More than {MAX_FILES} files matched for "{term}" in {root}. Please narrow your search '
            "(a more specific term or a sub-directory).\n"
        )
    total = sum(n for _, n in counts)
    body = "\n".join(f"{path} ({n} matches)" for path, n in counts)
    return f'Found {total} matches for "{term}" in {root}:\n{body}\nEnd of matches for "{term}" in {root}\n'


def search_file(term, path):
    lines = file_lines(path)
    if lines is None:
        raise ToolError(f"{path} is not a readable text file")
    hits = [(i, line) for i, line in enumerate(lines, 1) if term in line]
    if not hits:
        return f'No matches found for "{term}" in {path}\n'
    shown = [f"{i}:{line[:MAX_LINE_CHARS]}" for i, line in hits[:MAX_LINES]]
    if len(hits) > MAX_LINES:
        shown.append(f"[... {len(hits) - MAX_LINES} more matching lines; narrow your search ...]")
    body = "\n".join(shown)
    return f'Matches for "{term}" in {path}:\n{body}\nEnd of matches for "{term}" in {path}\n'


def search(params):
    term = params.get("search_term", "")
    if not term:
        raise ToolError("the search_term parameter is required")
    path = str(params.get("path", "") or ".").strip()
    if not os.path.exists(path):
        raise ToolError(f"the path {path} does not exist")
    emit(search_dir(term, path) if os.path.isdir(path) else search_file(term, path))


def main():
    return run_tool(search)


if __name__ == "__main__":
    sys.exit(main())
