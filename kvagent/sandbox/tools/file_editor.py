#!/usr/bin/env python3
"""file_editor: view, create, str_replace, insert and undo_edit files inside the sandbox.

Stdlib only (plus _toolkit.py beside it), python >= 3.7 (old task images). Parameters come from
`--params-file FILE` (JSON object of strings) or `--key value` pairs. Edit history for undo_edit
is kept in $KVAGENT_STATE_DIR so it survives between calls. Errors: `ERROR: ...` and exit 1.
"""

import ast
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # even under PYTHONSAFEPATH / -P
from _toolkit import ToolError, emit, run_tool  # noqa: E402

MAX_CHARS = 10000  # observation cap; the model is told to narrow with view_range or grep -n
SNIPPET_CONTEXT = 4  # lines shown around an edit
AUTO_CONCISE_LINES = 110  # whole-file views of larger .py files are condensed
CLIPPED = (
    "<response clipped><NOTE>Only part of this output is shown to save context. Use view_range, "
    "or search/grep -n to find the line numbers you need.</NOTE>"
)
COMMANDS = ("view", "create", "str_replace", "insert", "undo_edit")


def clip(text):
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS] + CLIPPED


def text_lines(text):
    """Lines as cat -n shows them: a final newline does not start another line."""
    lines = text.split("\n")
    if len(lines) > 1 and lines[-1] == "":
        lines.pop()
    return lines


def number(lines, first=1):
    return "\n".join(f"{first + i:6d}\t{line}" for i, line in enumerate(lines))


def read_text(path):
    # surrogateescape keeps undecodable bytes intact when the file is written back
    with open(path, encoding="utf-8", errors="surrogateescape", newline="") as f:
        return f.read()


def write_text(path, text):
    with open(path, "w", encoding="utf-8", errors="surrogateescape", newline="") as f:
        f.write(text)


# --- edit history (undo_edit) ------------------------------------------------------------------
def history_file():
    state = os.environ.get("KVAGENT_STATE_DIR") or "/tmp/kvagent_state"
    return os.path.join(state, "file_editor_history.json")


def load_history():
    try:
        with open(history_file(), encoding="utf-8", errors="surrogateescape") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def save_history(history):
    path = history_file()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8", errors="surrogateescape") as f:
        json.dump(history, f)
    os.replace(tmp, path)  # atomic: an interrupted call never corrupts the history


def remember(path, old_text):
    """old_text None means the file did not exist (undo deletes it)."""
    history = load_history()
    history.setdefault(path, []).append(old_text)
    save_history(history)


# --- commands ------------------------------------------------------------------------------------
def parse_view_range(raw):
    try:
        value = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        value = [p for p in raw.strip().strip("[]()").replace(",", " ").split()]
    try:
        start, end = [int(v) for v in value]
    except (TypeError, ValueError):
        raise ToolError(
            f"invalid view_range {raw!r}: expected two integers like [10, 20] or [10, -1]"
        ) from None
    return start, end


def list_dir(path):
    out = []

    def walk(d, depth):
        try:
            names = sorted(os.listdir(d))
        except OSError as e:
            raise ToolError(f"cannot list {d}: {e.strerror}") from None
        for name in names:
            if name.startswith("."):
                continue
            full = os.path.join(d, name)
            out.append(full)
            if depth < 2 and os.path.isdir(full) and not os.path.islink(full):
                walk(full, depth + 1)

    walk(path, 1)
    return out


def node_end(node):
    end = getattr(node, "end_lineno", None)
    if end:
        return end
    return max(getattr(n, "lineno", 0) for n in ast.walk(node))  # python 3.7 has no end_lineno


def elided_view(path, text):
    """(line_number, text) pairs with long function bodies replaced by one notice each."""
    try:
        tree = ast.parse(text)
    except SyntaxError as e:
        raise ToolError(f"cannot show a concise view of {path}: syntax error at line {e.lineno}") from None
    spans = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first, last = node.body[0].lineno, node_end(node)
            if last - first >= 3:
                spans.append((first, last))
    hidden = {}
    for first, last in sorted(spans):
        if first not in hidden:  # nested functions lie inside an outer span already
            for n in range(first, last + 1):
                hidden.setdefault(n, (first, last))
    rows = []
    for i, line in enumerate(text.split("\n"), 1):
        span = hidden.get(i)
        if span is None:
            rows.append((i, line))
        elif span[0] == i:
            rows.append((i, f"... eliding lines {span[0]}-{span[1]} ..."))
    return rows


def view(path, p):
    if os.path.isdir(path):
        body = "\n".join(list_dir(path))
        return clip(
            f"Here's the files and directories up to 2 levels deep in {path}, excluding hidden:\n{body}\n"
        )
    text = read_text(path).expandtabs()
    lines = text_lines(text)
    concise = str(p.get("concise", "")).strip().lower() in ("true", "1", "yes")
    if "view_range" in p and str(p["view_range"]).strip():
        start, end = parse_view_range(p["view_range"])
        n = len(lines)
        if not 1 <= start <= max(n, 1):
            raise ToolError(f"invalid view_range [{start}, {end}]: start must be in [1, {n}]")
        if end != -1 and not start <= end <= n:
            raise ToolError(
                f"invalid view_range [{start}, {end}]: end must be in [{start}, {n}], or -1 for the end of the file"
            )
        shown = lines[start - 1 : (n if end == -1 else end)]
        return clip(f"Here's the result of running `cat -n` on {path}:\n{number(shown, start)}\n")
    if path.endswith(".py") and (concise or len(lines) > AUTO_CONCISE_LINES):
        rows = [(i, line) for i, line in elided_view(path, text) if i <= len(lines)]
        body = "\n".join(f"{i:6d}\t{line}" for i, line in rows)
        return clip(
            f"Here is a condensed view of {path} (long function bodies elided; use view_range to see them):\n{body}\n"
        )
    return clip(f"Here's the result of running `cat -n` on {path}:\n{number(lines)}\n")


def snippet(text, first_line, last_line):
    """Lines first_line..last_line (1-based) of text with SNIPPET_CONTEXT lines around them."""
    lines = text_lines(text)
    lo = max(1, first_line - SNIPPET_CONTEXT)
    hi = min(len(lines), last_line + SNIPPET_CONTEXT)
    return number(lines[lo - 1 : hi], lo)


def create(path, p):
    if "file_text" not in p:
        raise ToolError("create needs the file_text parameter (the content of the new file)")
    if os.path.exists(path):
        raise ToolError(f"{path} already exists; use str_replace or insert to change it")
    parent = os.path.dirname(path)
    if parent and not os.path.isdir(parent):
        os.makedirs(parent)
    write_text(path, p["file_text"])
    remember(path, None)
    shown = clip(number(text_lines(p["file_text"].expandtabs())))
    return f"File created at {path}. Here's the result of running `cat -n` on {path}:\n{shown}\nReview the file and make sure that it is as expected. Edit the file if necessary.\n"


def line_of(text, index):
    return text.count("\n", 0, index) + 1


def str_replace(path, p):
    if "old_str" not in p or p["old_str"] == "":
        raise ToolError("str_replace needs a non-empty old_str parameter")
    old, new = p["old_str"], p.get("new_str", "")
    text = read_text(path)
    hits = []
    i = text.find(old)
    while i != -1:
        hits.append(i)
        i = text.find(old, i + 1)
    if not hits:
        raise ToolError(
            f"no occurrence of old_str in {path}; it must match the file exactly, whitespace included"
        )
    if len(hits) > 1:
        lines = ", ".join(str(line_of(text, h)) for h in hits)
        raise ToolError(
            f"old_str occurs {len(hits)} times in {path} (lines {lines}); include more context to make it unique"
        )
    updated = text[: hits[0]] + new + text[hits[0] + len(old) :]
    write_text(path, updated)
    remember(path, text)
    first = line_of(text, hits[0])
    shown = clip(snippet(updated.expandtabs(), first, first + new.count("\n")))
    return f"The file {path} has been edited. Here's the result of running `cat -n` on a snippet of {path}:\n{shown}\nReview the changes and make sure they are as expected. Edit the file again if necessary.\n"


def insert(path, p):
    if "new_str" not in p:
        raise ToolError("insert needs the new_str parameter (the text to insert)")
    raw = str(p.get("insert_line", "")).strip()
    try:
        after = int(raw)
    except ValueError:
        raise ToolError(
            f"insert needs insert_line as an integer (insert after that line; 0 = top), got {raw!r}"
        ) from None
    text = read_text(path)
    lines = text.split("\n")
    n = len(lines) - 1 if text.endswith("\n") or text == "" else len(lines)
    if not 0 <= after <= n:
        raise ToolError(f"invalid insert_line {after}: must be in [0, {n}]")
    new_lines = p["new_str"].split("\n")
    updated = "\n".join(lines[:after] + new_lines + lines[after:])
    write_text(path, updated)
    remember(path, text)
    shown = clip(snippet(updated.expandtabs(), after + 1, after + len(new_lines)))
    return f"The file {path} has been edited. Here's the result of running `cat -n` on a snippet of the edited file:\n{shown}\nReview the changes and make sure they are as expected (correct indentation, no duplicate lines, etc). Edit the file again if necessary.\n"


def undo_edit(path, p):
    history = load_history()
    stack = history.get(path) or []
    if not stack:
        raise ToolError(f"no edit history for {path}; nothing to undo")
    old = stack.pop()
    if old is None:
        os.remove(path)
        save_history(history)
        return f"Last edit to {path} undone successfully: the file was created by that edit and is removed.\n"
    write_text(path, old)
    save_history(history)
    return f"Last edit to {path} undone successfully. Here's the result of running `cat -n` on {path}:\n{clip(number(text_lines(old.expandtabs())))}\n"


def run(p):
    command = str(p.get("command", "")).strip()
    if command not in COMMANDS:
        raise ToolError("unknown command {!r}; use one of {}".format(command, ", ".join(COMMANDS)))
    raw_path = str(p.get("path", "")).strip()
    if not raw_path:
        raise ToolError("the path parameter is required (e.g. /testbed/file.py)")
    path = os.path.abspath(raw_path)
    if command != "create" and not os.path.exists(path):
        raise ToolError(f"the path {path} does not exist")
    if command != "view" and os.path.isdir(path):
        raise ToolError(f"{path} is a directory; only view works on directories")
    return {
        "view": view,
        "create": create,
        "str_replace": str_replace,
        "insert": insert,
        "undo_edit": undo_edit,
    }[command](path, p)


def main():
    return run_tool(lambda params: emit(run(params)), errors=(ToolError, OSError, UnicodeError))


if __name__ == "__main__":
    sys.exit(main())
