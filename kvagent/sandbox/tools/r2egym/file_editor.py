#!/usr/bin/env python3
"""file_editor (r2egym profile): view / create / str_replace / insert / undo_edit with the output and
error texts of R2E-Gym's r2egym file_editor, its oddities included (docs/deepswe.md): only `.py`
files and directories can be viewed; a directory lists directories and `.py` files two levels deep;
a file view numbers lines as `%6d ` (a space, where edits' snippets use a tab); a `.py` file of more
than 110 lines viewed whole is shown condensed (function bodies of 4+ lines and long class docstrings
elided); outputs past 10,000 characters are clipped with a note; errors print `ERROR: ...` with exit
code 0. One difference: files are decoded as UTF-8 (else Latin-1) where R2E-Gym asks chardet.

Stdlib only (plus _r2e.py beside it), python >= 3.6 (R2E images' task interpreter). Edit history
lives in $KVAGENT_STATE_DIR.
"""

import argparse
import ast
import json
import os
import sys
import traceback
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _r2e import argv, captured, emit, state_path  # noqa: E402

SNIPPET_LINES = 4
MAX_RESPONSE_LEN = 10000
AUTO_CONCISE_LINES = 110
CLIP_NOTE = (
    "<response clipped><NOTE>To save on context only part of this file has been shown to you. You "
    "should retry this tool after you have searched inside the file with `grep -n` in order to find "
    "the line numbers of what you are looking for.</NOTE>"
)
LINT_ERROR = (
    "Your proposed edit has introduced new syntax error(s).\n"
    "Please read this error message carefully and then retry editing the file.\nERRORS:\n"
)
CONDENSED = (
    "Here is a condensed view for file: {}; [Note: Useful for understanding file structure in a concise "
    "manner. Please use specific view_range without concise cmd if you want to explore further into "
    "the relevant parts.]\n"
)
HISTORY = "r2egym_editor_state.json"


class EditorError(Exception):
    pass


def clip(text):
    return text if len(text) <= MAX_RESPONSE_LEN else text[:MAX_RESPONSE_LEN] + CLIP_NOTE


def numbered(content, descriptor, first=1):
    lines = clip(content).expandtabs().split("\n")
    body = "\n".join(f"{i + first:6}\t{line}" for i, line in enumerate(lines))
    return f"Here's the result of running `cat -n` on {descriptor}:\n{body}\n"


def read_path(path):
    # text mode semantics of Path.read_text: \r\n and \r become \n
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("latin-1")
    return text.replace("\r\n", "\n").replace("\r", "\n")


def read_file(path):
    try:
        return read_path(path)
    except Exception as e:
        raise EditorError(f"Failed to read file {path}: {e}") from None


def write_file(path, text):
    try:
        path.write_text(text, encoding="utf-8")
    except Exception as e:
        raise EditorError(f"Failed to write file {path}: {e}") from None


def lint(text, path):
    try:
        ast.parse(text, filename=path)
        return ""
    except SyntaxError as e:
        return str(e)


def deepest_line(node):
    """The largest line number in the subtree (what python < 3.8, without end_lineno, offers)."""
    return max([getattr(node, "lineno", 0)] + [deepest_line(c) for c in ast.iter_child_nodes(node)])


def body_span(node):
    """0-based (first, last) line of a function body as R2E-Gym computes it. With end_lineno
    (python >= 3.8): first statement to the end of the last. Without (the task's python 3.6 or 3.7,
    which R2E-Gym's tools run under): the first statement's line less the docstring's line count
    (a multi-line string reports its last line there), to the deepest line of the last statement."""
    last = node.body[-1]
    start = node.body[0].lineno - 1
    if getattr(last, "end_lineno", None):
        return start, last.end_lineno - 1
    doc = ast.get_docstring(node)
    if doc:
        start -= doc.count("\n") + 1
    return start, deepest_line(last) - 1


def docstring_span(cls):
    """0-based (first, last) line of a class docstring as R2E-Gym computes it; without end_lineno
    it starts from the class line itself."""
    first = cls.body[0]
    if getattr(first, "end_lineno", None):
        return first.lineno - 1, first.end_lineno - 1
    return cls.lineno, deepest_line(first) - 1


def elided_lines(path):
    """(0-based index, text) of a condensed view: function bodies spanning 4+ lines and class
    docstrings spanning 5+ lines replaced by one `... eliding lines a-b ...` line each."""
    text = read_path(path)
    try:
        tree = ast.parse(text, filename=str(path))
    except SyntaxError as e:
        raise EditorError(f"Syntax error for file {path}: {e}") from None
    ranges = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            start, end = body_span(node)
            if end - start >= 3:
                ranges.append((start, end))
        if isinstance(node, ast.ClassDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(
                getattr(first.value, "value", getattr(first.value, "s", None)), str
            ):
                start, end = docstring_span(node)
                if end - start >= 4:
                    ranges.append((start + 1, end - 1))
    skip = {i for a, b in ranges for i in range(a, b + 1)}
    notes = [(a, f"... eliding lines {a + 1}-{b + 1} ...") for a, b in ranges]
    kept = [(i, line) for i, line in enumerate(text.splitlines()) if i not in skip]
    return sorted(notes + kept, key=lambda x: x[0])


class Editor:
    def __init__(self, history, enable_linting):
        self.history, self.enable_linting = history, enable_linting

    def run(self, command, path_str, args):
        path = Path(path_str)
        if command == "create":
            if path.exists():
                raise EditorError(f"File already exists at: {path}. Cannot overwrite with 'create'.")
        elif not path.exists():
            raise EditorError(f"The path '{path}' does not exist.")
        if path.is_dir() and command != "view":
            raise EditorError(f"The path '{path}' is a directory. Only 'view' can be used on directories.")
        if command == "view":
            return self.view(path, args.view_range, args.concise)
        if command == "create":
            return self.create(path, args.file_text)
        if command == "str_replace":
            return self.str_replace(path, args.old_str, args.new_str)
        if command == "insert":
            return self.insert(path, args.insert_line, args.new_str)
        if command == "undo_edit":
            return self.undo(path)
        raise EditorError(
            f"Unrecognized command '{command}'. Allowed commands: view, create, str_replace, insert, undo_edit."
        )

    def view(self, path, view_range, concise):
        if path.is_dir():
            find = [
                "find",
                str(path),
                "-maxdepth",
                "2",
                "-not",
                "-path",
                "*/.*",
                "(",
                "-type",
                "d",
                "-o",
                "-name",
                "*.py",
                ")",
            ]
            _, out, err = captured(find)
            if err.strip():
                return "", err.strip()
            head = f"Here's the files and directories up to 2 levels deep in {path}, excluding hidden:\n"
            return clip(head + out), ""
        if path.suffix != ".py":
            # R2E-Gym puts ERROR: in the message and again when printing it
            return (
                "",
                f"ERROR: Viewing non-Python files is disallowed for saving context. File '{path.name}' is not a .py file.",
            )
        if not view_range and not concise and len(read_path(path).splitlines()) > AUTO_CONCISE_LINES:
            concise = True
        lines = elided_lines(path) if concise else list(enumerate(read_path(path).splitlines()))
        if view_range:
            start, end = view_range
            total = len(lines)
            if not 1 <= start <= total:
                return "", f"Invalid view_range {view_range}: start line must be in [1, {total}]"
            if end != -1 and (end < start or end > total):
                return (
                    "",
                    f"Invalid view_range {view_range}: end must be >= start and <= {total}, or -1 to view until end.",
                )
            lines = [(i, t) for i, t in lines if i + 1 >= start and (end == -1 or i + 1 <= end)]
        head = (
            CONDENSED.format(path)
            if concise
            else f"Here's the result of running `cat -n` on the file: {path}:\n"
        )
        return clip(head + "\n".join(f"{i + 1:6d} {t}" for i, t in lines)), ""

    def create(self, path, file_text):
        if file_text is None:
            raise EditorError("Cannot create file without 'file_text' parameter.")
        if self.enable_linting and path.suffix == ".py":
            error = lint(file_text, str(path))
            if error:
                return "", LINT_ERROR + error
        try:
            path.write_text(file_text, encoding="utf-8")
            self.history.setdefault(str(path), []).append("")  # undo after create empties the file
        except Exception as e:
            raise EditorError(f"Error creating file at {path}: {e}") from None
        return (
            f"File created at {path}. "
            + numbered(file_text, str(path))
            + "Review the file and make sure that it is as expected. Edit the file if necessary."
        ), ""

    def str_replace(self, path, old_str, new_str):
        if old_str is None:
            raise EditorError("Missing required parameter 'old_str' for 'str_replace'.")
        content = read_file(path)
        n = content.count(old_str)
        if n == 0:
            raise EditorError(f"No occurrences of '{old_str}' found in {path} for replacement.")
        if n > 1:
            raise EditorError(
                f"Multiple occurrences of '{old_str}' found in {path}. Please ensure it is unique before using str_replace."
            )
        updated = content.replace(old_str, new_str if new_str else "")
        if self.enable_linting and path.suffix == ".py":
            error = lint(updated, str(path))
            if error:
                return "", LINT_ERROR + error
        self.history.setdefault(str(path), []).append(content)
        write_file(path, updated)
        line = content.split(old_str)[0].count("\n")
        start = max(0, line - SNIPPET_LINES)
        end = line + SNIPPET_LINES + (new_str or "").count("\n")
        snippet = "\n".join(updated.split("\n")[start : end + 1])
        return (
            f"The file {path} has been edited. "
            + numbered(snippet, f"a snippet of {path}", start + 1)
            + "Review the changes and make sure they are as expected. Edit the file again if necessary."
        ), ""

    def insert(self, path, insert_line, new_str):
        if new_str is None:
            raise EditorError("Missing required parameter 'new_str' for 'insert'.")
        old = read_file(path)
        lines = old.split("\n")
        if insert_line < 0 or insert_line > len(lines):  # a missing insert_line fails here (TypeError)
            raise EditorError(f"Invalid insert_line {insert_line}. Must be in [0, {len(lines)}].")
        new_lines = new_str.split("\n")
        updated = "\n".join(lines[:insert_line] + new_lines + lines[insert_line:])
        if self.enable_linting and path.suffix == ".py":
            error = lint(updated, str(path))
            if error:
                return "", LINT_ERROR + error
        self.history.setdefault(str(path), []).append(old)
        write_file(path, updated)
        snippet = (
            lines[max(0, insert_line - SNIPPET_LINES) : insert_line]
            + new_lines
            + lines[insert_line : insert_line + SNIPPET_LINES]
        )
        return (
            f"The file {path} has been edited. "
            + numbered(
                "\n".join(snippet), "a snippet of the edited file", max(1, insert_line - SNIPPET_LINES + 1)
            )
            + "Review the changes and make sure they are as expected (correct indentation, no duplicate "
            "lines, etc). Edit the file again if necessary."
        ), ""

    def undo(self, path):
        edits = self.history.get(str(path)) or []
        if not edits:
            raise EditorError(f"No previous edits found for {path} to undo.")
        old = edits.pop()
        write_file(path, old)
        return f"Last edit to {path} undone successfully. " + numbered(old, str(path)), ""


def view_range_arg(text):
    parts = text.strip().strip("[]()").replace(",", " ").split()
    if len(parts) != 2:
        raise argparse.ArgumentTypeError("Expected two numbers, got: {}".format(text.strip().strip("[]()")))
    try:
        return [int(parts[0]), int(parts[1])]
    except ValueError:
        raise argparse.ArgumentTypeError(f"Could not convert {parts} to integers.") from None


def parser():
    p = argparse.ArgumentParser(prog="file_editor", description="View, create and edit files.")
    p.add_argument("command", type=str)
    p.add_argument("--path", type=str)
    p.add_argument("--file_text", type=str, default=None)
    p.add_argument("--view_range", type=view_range_arg, default=None)
    p.add_argument("--old_str", type=str, default=None)
    p.add_argument("--new_str", type=str, default=None)
    p.add_argument("--insert_line", type=int, default=None)
    p.add_argument("--enable_linting", type=bool, default=False)  # any non-empty value is true
    p.add_argument("--concise", type=str, default="False")
    p.add_argument("--python_only", type=bool, default=True)  # accepted, never used (as in R2E-Gym)
    return p


def load_history(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return {}
    except Exception as e:
        emit(f"Warning: Could not load editor history from {path}: {e}\n")
        return {}


def main():
    args = parser().parse_args(argv())
    args.concise = args.concise.lower() == "true"
    history_file = state_path(HISTORY)
    editor = Editor(load_history(history_file), args.enable_linting)
    try:
        output, error = editor.run(args.command, args.path, args)
        emit(output + "\n")
        if error:
            emit(f"ERROR: {error}\n")
    except EditorError as e:
        emit(f"ERROR: {e}\n")
    except Exception as e:
        emit(f"ERROR: Unhandled exception: {e}\n")
        sys.stdout.flush()
        traceback.print_exc()
    try:
        with open(history_file, "w", encoding="utf-8") as f:
            json.dump(editor.history, f)
    except Exception as e:
        emit(f"Warning: Could not write editor history to {history_file}: {e}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
