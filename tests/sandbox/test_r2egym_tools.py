"""The r2egym tool scripts (tools/r2egym/) on a fixture repository: each tool's exact output, and the
observation the agent's `r2egym` profile builds from it, as R2E-Gym's scaffold shows them."""

from __future__ import annotations

import pytest

from kvagent.agent.r2egym import observation, runtime_output

from .conftest import BACKENDS, make_repo, open_backend

DIVIDER = "-" * 50


@pytest.fixture(params=BACKENDS)
def sb(request, tmp_path):
    box = open_backend(request.param, make_repo(tmp_path / "repo"), request)
    yield box
    box.close()


def tool(sb, name, timeout=30, **params):
    return sb.run_tool(f"r2egym/{name}", params, timeout=timeout)


def seen(sb, name, timeout=30, **params):
    """The observation text the model reads for this call under the r2egym profile."""
    out, code = runtime_output(tool(sb, name, timeout, **params), timeout)
    return observation(name, out, code)


def real(sb):
    return sb.run("pwd -P").output.strip()


# --------------------------------------------------------------------------------------- execute_bash
def test_bash_sections_and_header(sb):
    r = tool(sb, "execute_bash", cmd="echo hi; echo err >&2")
    assert (r.exit_code, r.output) == (0, "[STDOUT]\n\nhi \n\n[STDERR]\n\nerr\n")
    assert seen(sb, "execute_bash", cmd="echo hi") == (
        "Exit code: 0\nExecution output of [execute_bash]:\n[STDOUT]\n\nhi \n\n[STDERR]\n\n\n"
    )


def test_bash_failure_is_headed_and_keeps_its_status(sb):
    r = tool(sb, "execute_bash", cmd="echo out; exit 3")
    assert (r.exit_code, r.output) == (3, "Error executing command:\n\n[STDOUT]\n\nout \n\n[STDERR]\n\n\n")
    assert seen(sb, "execute_bash", cmd="exit 3").startswith(
        "Exit code: Error: Exit code 3\nExecution output of [execute_bash]:\nError executing command:\n\n[STDOUT]"
    )


def test_bash_runs_sh_not_bash(sb):
    assert "[STDOUT]\n\nsh-ok" in tool(sb, "execute_bash", cmd='[ -z "$BASH_VERSION" ] && echo sh-ok').output


@pytest.mark.parametrize("first", ["git", "ipython", "jupyter", "nohup"])
def test_bash_refuses_by_first_word(sb, first):
    r = tool(sb, "execute_bash", cmd=f"  {first} --version")
    assert (r.exit_code, r.output) == (
        1,
        f"Bash command '{first}' is not allowed. Please use a different command or tool.\n",
    )


def test_bash_refusal_looks_only_at_the_first_word(sb):
    assert tool(sb, "execute_bash", cmd="true && nohup true").exit_code == 0


def test_bash_truncates_to_40_and_40_lines(sb):
    text = seen(sb, "execute_bash", cmd="seq 1 100")
    head, marker, tail = text.partition(
        f"\n{DIVIDER}\n<Observation truncated in middle for saving context>\n{DIVIDER}\n"
    )
    assert marker
    assert head.splitlines()[2:] == ["[STDOUT]", "", *map(str, range(1, 39))]
    body = tail.split("\n")
    assert (
        len(body) == 40 and body[:2] == ["65", "66"] and body[-6:] == ["99", "100 ", "", "[STDERR]", "", ""]
    )


def test_bash_80_lines_are_not_truncated(sb):
    assert "truncated" not in seen(sb, "execute_bash", cmd="seq 1 74")  # 80 lines with the sections


def test_bash_timeout_message_and_code(sb):
    r = tool(sb, "execute_bash", timeout=1, cmd="sleep 20")
    assert r.exit_code == 124
    assert observation("execute_bash", *runtime_output(r, 1)) == (
        "Exit code: -1\nExecution output of [execute_bash]:\nThe command took too long to execute (>1s)"
    )


def test_bash_missing_cmd_is_argparse_error(sb):
    r = tool(sb, "execute_bash", command="ls")
    assert r.exit_code == 2
    assert "usage: execute_bash [-h] --cmd CMD" in r.output
    assert "execute_bash: error: the following arguments are required: --cmd" in r.output


# --------------------------------------------------------------------------------------- file_editor
def test_view_python_file_numbers_with_a_space(sb):
    root = sb.workdir
    r = tool(sb, "file_editor", command="view", path=f"{root}/a.py")
    lines = ["def add(a, b):", "    return a + b", "", "", "def sub(a, b):", "    value = a - b",
             "    return value", "", "", "TOTAL = add(1, 2)"]  # fmt: skip
    body = "\n".join(f"{i:6d} {line}" for i, line in enumerate(lines, 1))
    assert r.output == f"Here's the result of running `cat -n` on the file: {root}/a.py:\n{body}\n"
    assert seen(sb, "file_editor", command="view", path=f"{root}/a.py").startswith(
        "Execution output of [file_editor]:\nHere's the result"
    )


def test_view_refuses_non_python_files_with_double_error(sb):
    r = tool(sb, "file_editor", command="view", path=f"{sb.workdir}/README.md")
    assert (r.exit_code, r.output) == (
        0,
        "\nERROR: ERROR: Viewing non-Python files is disallowed for saving context. "
        "File 'README.md' is not a .py file.\n",
    )


def test_view_directory_lists_dirs_and_python_files_two_deep(sb):
    root = sb.workdir
    out = tool(sb, "file_editor", command="view", path=root).output
    head = f"Here's the files and directories up to 2 levels deep in {root}, excluding hidden:\n"
    assert out.startswith(head) and out.endswith("\n\n")
    listed = set(out[len(head) :].split())
    assert {
        root,
        f"{root}/a.py",
        f"{root}/pkg",
        f"{root}/pkg/mod.py",
        f"{root}/pkg/deep",
        f"{root}/docs",
    } <= listed
    assert not any(x.endswith((".md", ".txt")) or "/." in x or "inner" in x for x in listed)


def test_condensed_view(sb):
    root = sb.workdir
    out = tool(sb, "file_editor", command="view", path=f"{root}/long.py", concise="True").output
    assert out.startswith(f"Here is a condensed view for file: {root}/long.py; [Note: ")
    assert out.endswith(
        "\n     1 def big(x):\n     2 ... eliding lines 2-5 ...\n     6 \n     7 \n     8 class K:\n     9     pass\n"
    )


def test_long_python_file_is_condensed_unless_a_range_is_given(sb):
    root = sb.workdir
    sb.write(
        f"{root}/big.py",
        "".join(f"def f{i}(x):\n    a = x\n    b = a\n    c = b\n    return c\n\n" for i in range(25)),
    )
    assert (
        "     2 ... eliding lines 2-5 ...\n     6 \n     7 def f1(x):\n"
        in tool(sb, "file_editor", command="view", path=f"{root}/big.py").output
    )
    ranged = tool(sb, "file_editor", command="view", path=f"{root}/big.py", view_range="[1, 3]").output
    assert ranged.endswith(
        "on the file: " + f"{root}/big.py:\n     1 def f0(x):\n     2     a = x\n     3     b = a\n"
    )


def test_clip_at_10000_characters(sb):
    root = sb.workdir
    sb.write(f"{root}/wide.py", "".join(f"X{i} = '{'y' * 140}'\n" for i in range(100)))
    out = tool(sb, "file_editor", command="view", path=f"{root}/wide.py").output
    note = out[10000:]
    assert note.startswith(
        "<response clipped><NOTE>To save on context only part of this file"
    ) and note.endswith("</NOTE>\n")


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"view_range": "[0, 3]"}, "\nERROR: Invalid view_range [0, 3]: start line must be in [1, 10]\n"),
        (
            {"view_range": "[4, 99]"},
            "\nERROR: Invalid view_range [4, 99]: end must be >= start and <= 10, or -1 to view until end.\n",
        ),
    ],
)
def test_view_range_errors(sb, params, expected):
    assert tool(sb, "file_editor", command="view", path=f"{sb.workdir}/a.py", **params).output == expected


def test_str_replace_snippet_and_undo(sb):
    root = sb.workdir
    r = tool(
        sb,
        "file_editor",
        command="str_replace",
        path=f"{root}/a.py",
        old_str="value = a - b",
        new_str="value = b - a",
    )
    lines = ["    return a + b", "", "", "def sub(a, b):", "    value = b - a", "    return value", "", "",
             "TOTAL = add(1, 2)"]  # fmt: skip
    body = "\n".join(f"{i:6}\t{line}" for i, line in enumerate(lines, 2))
    assert r.output == (
        f"The file {root}/a.py has been edited. Here's the result of running `cat -n` on a snippet of "
        f"{root}/a.py:\n{body}\nReview the changes and make sure they are as expected. Edit the file again "
        "if necessary.\n"
    )
    undo = tool(sb, "file_editor", command="undo_edit", path=f"{root}/a.py").output
    assert undo.startswith(
        f"Last edit to {root}/a.py undone successfully. Here's the result of running `cat -n` on {root}/a.py:\n     1\tdef add"
    )
    assert "value = a - b" in sb.read(f"{root}/a.py")


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        (
            {"command": "str_replace", "old_str": "zzz"},
            "ERROR: No occurrences of 'zzz' found in {p} for replacement.\n",
        ),
        (
            {"command": "str_replace", "old_str": "return"},
            "ERROR: Multiple occurrences of 'return' found in {p}. Please ensure it is unique before using str_replace.\n",
        ),
        (
            {"command": "create", "file_text": "x"},
            "ERROR: File already exists at: {p}. Cannot overwrite with 'create'.\n",
        ),
        ({"command": "undo_edit"}, "ERROR: No previous edits found for {p} to undo.\n"),
        (
            {"command": "delete"},
            "ERROR: Unrecognized command 'delete'. Allowed commands: view, create, str_replace, insert, undo_edit.\n",
        ),
        ({"command": "str_replace"}, "ERROR: Missing required parameter 'old_str' for 'str_replace'.\n"),
    ],
)
def test_editor_errors(sb, params, expected):
    path = f"{sb.workdir}/a.py"
    r = tool(sb, "file_editor", path=path, **params)
    assert (r.exit_code, r.output) == (0, expected.format(p=path))


def test_editor_missing_path_and_insert_line(sb):
    root = sb.workdir
    assert tool(sb, "file_editor", command="view", path=f"{root}/nope.py").output == (
        f"ERROR: The path '{root}/nope.py' does not exist.\n"
    )
    r = tool(sb, "file_editor", command="insert", path=f"{root}/a.py", new_str="x = 1")
    assert r.output.startswith(
        "ERROR: Unhandled exception: '<' not supported between instances of 'NoneType' and 'int'\n"
    )
    assert "Traceback" in r.output and r.exit_code == 0


def test_create_then_insert(sb):
    root = sb.workdir
    r = tool(sb, "file_editor", command="create", path=f"{root}/new.py", file_text="a = 1\nb = 2")
    assert r.output == (
        f"File created at {root}/new.py. Here's the result of running `cat -n` on {root}/new.py:\n"
        "     1\ta = 1\n     2\tb = 2\nReview the file and make sure that it is as expected. Edit the file if necessary.\n"
    )
    r = tool(sb, "file_editor", command="insert", path=f"{root}/new.py", insert_line="1", new_str="c = 3")
    assert (
        "a snippet of the edited file:\n     1\ta = 1\n     2\tc = 3\n     3\tb = 2\nReview the changes"
        in r.output
    )
    assert sb.read(f"{root}/new.py") == "a = 1\nc = 3\nb = 2"


# --------------------------------------------------------------------------------------- search, finish
def test_search_directory_counts_python_files_only(sb):
    d = real(sb)
    assert tool(sb, "search", search_term="add").output == (
        f'Found 2 matches for "add" in {d}:\n./a.py (2 matches)\nEnd of matches for "add" in {d}\n'
    )
    # README.md holds "hello" but only .py files are searched
    assert (
        tool(sb, "search", search_term="hello", path=".").output == f'No matches found for "hello" in {d}\n'
    )


def test_search_file_is_grep_n(sb):
    root = sb.workdir
    assert tool(sb, "search", search_term="hel*o", path=f"{root}/README.md").output == (
        f'Matches for "hel*o" in {root}/README.md:\n1:hello\n3:hello again\n'
    )


def test_search_over_100_files(sb):
    sb.run("mkdir many && for i in $(seq 1 101); do echo needle > many/f$i.py; done")
    d = real(sb)
    assert tool(sb, "search", search_term="needle").output == (
        f'More than 101 files matched for "needle" in {d}. Please narrow your search.\n'
    )


def test_finish(sb):
    assert tool(sb, "finish", command="submit").output == "<<<Finished>>>\n"
    assert observation("finish", "", "0") == "<<< Finished >>>"


@pytest.mark.parametrize("name", ["execute_bash", "file_editor", "search", "finish", "_r2e", "../_toolkit"])
def test_r2egym_scripts_are_python36_stdlib(name):
    """They run under R2E images' task interpreter (python 3.6 on old tasks), as R2E-Gym's do: 3.6
    syntax, the stdlib only, and none of the keyword arguments added in 3.7 (capture_output, text)."""
    import ast
    import re

    from kvagent.sandbox.base import R2EGYM_TOOL_NAMES, TOOLS_SRC

    assert f"r2egym/{name}" in R2EGYM_TOOL_NAMES or name.startswith(("_", "../"))
    src = (TOOLS_SRC / "r2egym" / f"{name}.py").read_text()
    tree = ast.parse(src, feature_version=(3, 6))
    new_kwargs = [k.arg for n in ast.walk(tree) if isinstance(n, ast.Call) for k in n.keywords]
    assert not {"capture_output", "text"} & set(new_kwargs)
    assert "from __future__ import annotations" not in src
    imported = set(re.findall(r"^(?:import|from) (\w+)", src, re.MULTILINE))
    stdlib = {
        "argparse",
        "ast",
        "contextlib",
        "json",
        "os",
        "pathlib",
        "signal",
        "subprocess",
        "sys",
        "traceback",
    }
    assert imported <= stdlib | {"_r2e", "_toolkit"}


def test_condensed_view_without_end_lineno_is_r2egyms_fallback():
    """Python 3.6 has no end_lineno and reports a multi-line string at its last line; R2E-Gym's
    editor then counts the docstring back and takes the deepest line of the last statement."""
    import ast
    import importlib.util
    import sys

    from kvagent.sandbox.base import TOOLS_SRC

    sys.path.insert(0, str(TOOLS_SRC / "r2egym"))
    try:
        spec = importlib.util.spec_from_file_location("r2e_editor", TOOLS_SRC / "r2egym" / "file_editor.py")
        editor = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(editor)
    finally:
        sys.path.remove(str(TOOLS_SRC / "r2egym"))
    src = 'class K:\n    """one\n    two\n    three\n    four\n    """\n\n    def f(self):\n        """doc\n        more"""\n        a = 1\n        return (a +\n                2)\n'
    tree = ast.parse(src)
    cls, fn = tree.body[0], tree.body[0].body[1]
    with_end = (editor.docstring_span(cls), editor.body_span(fn))
    assert with_end == ((1, 5), (8, 12))  # python >= 3.8
    for node in ast.walk(tree):  # what python 3.6 gives: no end_lineno, strings at their last line
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            node.lineno = node.value.lineno = node.end_lineno
        for attr in ("end_lineno", "end_col_offset"):
            if hasattr(node, attr):
                delattr(node, attr)
    assert editor.docstring_span(cls) == (1, 5)  # from the class line, to the string's (last) line
    assert editor.body_span(fn) == (7, 12)  # docstring's 2 lines counted back from its last line
