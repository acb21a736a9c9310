"""The four DeepSWE/R2E tools: every command and error case, identical on both backends."""

from __future__ import annotations

import ast
import re

import pytest

from kvagent.sandbox import TOOL_NAMES, SandboxError, open_sandbox
from kvagent.sandbox.base import TOOLS_SRC

from .conftest import open_backend

# Each case: a list of (tool, params, checks). A check is ("exit", code) or ("has", text) or
# ("lacks", text); "{root}" in params and texts stands for the repository path in the sandbox.
FE = "file_editor"
CASES = {
    "view_file": [(FE, {"command": "view", "path": "{root}/a.py"}, [("exit", 0), ("has", "     1\tdef add(a, b):"),
                  ("has", "cat -n` on {root}/a.py"), ("has", "    10\tTOTAL = add(1, 2)")])],
    "view_range": [(FE, {"command": "view", "path": "{root}/a.py", "view_range": "[5, 6]"},
                    [("exit", 0), ("has", "     5\tdef sub(a, b):\n     6\t    value = a - b\n"), ("lacks", "     7\t")])],
    "view_range_to_end": [(FE, {"command": "view", "path": "{root}/a.py", "view_range": "[9, -1]"},
                           [("exit", 0), ("has", "    10\tTOTAL"), ("lacks", "     8\t")])],
    "view_tabs_expanded": [(FE, {"command": "view", "path": "{root}/docs/guide.txt"}, [("has", "     2\t        Tabbed")])],
    "bad_view_range_start": [(FE, {"command": "view", "path": "{root}/a.py", "view_range": "[0, 3]"},
                              [("exit", 1), ("has", "ERROR: invalid view_range [0, 3]: start must be in [1, 10]")])],
    "bad_view_range_end": [(FE, {"command": "view", "path": "{root}/a.py", "view_range": "[4, 99]"},
                            [("exit", 1), ("has", "ERROR: invalid view_range [4, 99]: end must be in [4, 10]")])],
    "bad_view_range_format": [(FE, {"command": "view", "path": "{root}/a.py", "view_range": "[x]"},
                               [("exit", 1), ("has", "ERROR: invalid view_range")])],
    "view_dir": [(FE, {"command": "view", "path": "{root}"},
                  [("exit", 0), ("has", "up to 2 levels deep in {root}, excluding hidden:\n{root}/README.md\n"),
                   ("has", "{root}/pkg/deep\n"), ("lacks", "inner"), ("lacks", ".hidden"), ("lacks", ".git")])],
    "view_concise": [(FE, {"command": "view", "path": "{root}/long.py", "concise": "true"},
                      [("exit", 0), ("has", "condensed view"), ("has", "     1\tdef big(x):\n     2\t... eliding lines 2-5 ...\n     6\t\n"),
                       ("lacks", "b * 2"), ("has", "     8\tclass K:")])],
    "view_missing": [(FE, {"command": "view", "path": "{root}/nope.py"},
                      [("exit", 1), ("has", "ERROR: the path {root}/nope.py does not exist")])],
    "create": [
        (FE, {"command": "create", "path": "{root}/new/b.py", "file_text": "x = 1\ny = 2\n"},
         [("exit", 0), ("has", "File created at {root}/new/b.py"), ("has", "     2\ty = 2\n")]),
        (FE, {"command": "view", "path": "{root}/new/b.py"}, [("has", "     1\tx = 1\n     2\ty = 2\n")]),
    ],
    "create_existing": [(FE, {"command": "create", "path": "{root}/a.py", "file_text": "x"},
                         [("exit", 1), ("has", "ERROR: {root}/a.py already exists")])],
    "str_replace": [
        (FE, {"command": "str_replace", "path": "{root}/a.py", "old_str": "value = a - b", "new_str": "value = b - a"},
         [("exit", 0), ("has", "has been edited"), ("has", "     6\t    value = b - a")]),
        (FE, {"command": "view", "path": "{root}/a.py", "view_range": "[6, 6]"}, [("has", "b - a")]),
    ],
    "str_replace_not_unique": [
        (FE, {"command": "str_replace", "path": "{root}/README.md", "old_str": "hello", "new_str": "bye"},
         [("exit", 1), ("has", "ERROR: old_str occurs 2 times in {root}/README.md (lines 1, 3)")]),
    ],
    "str_replace_missing": [
        (FE, {"command": "str_replace", "path": "{root}/a.py", "old_str": "nothing like this", "new_str": "x"},
         [("exit", 1), ("has", "ERROR: no occurrence of old_str in {root}/a.py")]),
    ],
    "str_replace_missing_file": [
        (FE, {"command": "str_replace", "path": "{root}/gone.py", "old_str": "a", "new_str": "b"},
         [("exit", 1), ("has", "ERROR: the path {root}/gone.py does not exist")]),
    ],
    "insert": [
        (FE, {"command": "insert", "path": "{root}/a.py", "insert_line": "2", "new_str": "# after two"},
         [("exit", 0), ("has", "     3\t# after two\n"), ("has", "     2\t    return a + b\n")]),
        (FE, {"command": "insert", "path": "{root}/a.py", "insert_line": "0", "new_str": "# top"},
         [("exit", 0), ("has", "     1\t# top\n")]),
    ],
    "insert_bad_line": [
        (FE, {"command": "insert", "path": "{root}/a.py", "insert_line": "99", "new_str": "x"},
         [("exit", 1), ("has", "ERROR: invalid insert_line 99: must be in [0, 10]")]),
    ],
    "undo_edit": [
        (FE, {"command": "str_replace", "path": "{root}/a.py", "old_str": "TOTAL", "new_str": "SUM"}, [("exit", 0)]),
        (FE, {"command": "insert", "path": "{root}/a.py", "insert_line": "1", "new_str": "# note"}, [("exit", 0)]),
        (FE, {"command": "undo_edit", "path": "{root}/a.py"}, [("exit", 0), ("has", "SUM"), ("lacks", "# note")]),
        (FE, {"command": "undo_edit", "path": "{root}/a.py"}, [("exit", 0), ("has", "TOTAL"), ("lacks", "SUM")]),
        (FE, {"command": "undo_edit", "path": "{root}/a.py"},
         [("exit", 1), ("has", "ERROR: no edit history for {root}/a.py; nothing to undo")]),
    ],
    "undo_create": [
        (FE, {"command": "create", "path": "{root}/tmp.py", "file_text": "x\n"}, [("exit", 0)]),
        (FE, {"command": "undo_edit", "path": "{root}/tmp.py"}, [("exit", 0), ("has", "removed")]),
        (FE, {"command": "view", "path": "{root}/tmp.py"}, [("exit", 1), ("has", "does not exist")]),
    ],
    "undo_no_history": [(FE, {"command": "undo_edit", "path": "{root}/README.md"},
                         [("exit", 1), ("has", "ERROR: no edit history for {root}/README.md")])],
    "unknown_command": [(FE, {"command": "delete", "path": "{root}/a.py"},
                         [("exit", 1), ("has", "ERROR: unknown command 'delete'")])],
    "bash": [("execute_bash", {"cmd": "echo out; echo err >&2; exit 4"},
              [("exit", 4), ("has", "Exit code: 4\nExecution output of [execute_bash]:\n[STDOUT]\n\nout\n\n[STDERR]\n\nerr\n")])],
    "bash_cwd": [("execute_bash", {"cmd": "pwd && ls"}, [("exit", 0), ("has", "[STDOUT]\n\n{root}\nREADME.md\na.py\n")])],
    "bash_interactive_refused": [
        ("execute_bash", {"cmd": "vim a.py"}, [("exit", 2), ("has", "ERROR: `vim` is interactive")]),
        ("execute_bash", {"cmd": "python3"}, [("exit", 2), ("has", "without arguments")]),
        ("execute_bash", {"cmd": "cd pkg && less mod.py"}, [("exit", 2), ("has", "`less`")]),
        ("execute_bash", {"cmd": "top"}, [("exit", 2)]),
        ("execute_bash", {"cmd": "python3 -c 'print(1)'"}, [("exit", 0), ("has", "\n1\n")]),
    ],
    "bash_empty": [("execute_bash", {"cmd": "  "}, [("exit", 1), ("has", "ERROR: the cmd parameter is required")])],
    "search_dir": [("search", {"search_term": "hello"},
                    [("exit", 0), ("has", 'Found 2 matches for "hello" in .:\n./README.md (2 matches)\nEnd of matches'),
                     ("lacks", "hidden")])],
    "search_dir_abs": [("search", {"search_term": "def ", "path": "{root}/pkg"},
                        [("exit", 0), ("has", "{root}/pkg/mod.py (1 matches)")])],
    "search_file": [("search", {"search_term": "NAME", "path": "{root}/pkg/mod.py"},
                     [("exit", 0), ("has", 'Matches for "NAME" in {root}/pkg/mod.py:\n3:NAME = \'mod\'\n7:    return NAME\n')])],
    "search_none": [("search", {"search_term": "zzzz_nothing"}, [("exit", 0), ("has", 'No matches found for "zzzz_nothing"')])],
    "search_missing_path": [("search", {"search_term": "x", "path": "nowhere"},
                             [("exit", 1), ("has", "ERROR: the path nowhere does not exist")])],
    "finish": [("finish", {"command": "submit", "result": "done"}, [("exit", 0), ("has", "<<<Finished>>>")])],
    "finish_bad": [("finish", {"command": "abort"}, [("exit", 1), ("has", "ERROR: unknown command 'abort'")])],
}  # fmt: skip


def run_case(sb, steps) -> list[str]:
    """Run a case's calls, check them, and return observations with the repo root replaced."""
    seen = []
    for tool, params, checks in steps:
        r = sb.run_tool(tool, {k: v.replace("{root}", sb.workdir) for k, v in params.items()}, timeout=30)
        obs = r.output.replace(sb.workdir, "{root}")
        for kind, value in checks:
            if kind == "exit":
                assert r.exit_code == value, (tool, params, r)
            elif kind == "has":
                assert value in obs, (tool, params, obs)
            else:
                assert value not in obs, (tool, params, obs)
        seen.append(obs)
    return seen


def reset(sb) -> None:
    sb.run(
        f"git checkout -q -- . && git clean -qfdx && rm -f {sb.state_dir}/file_editor_history.json",
        timeout=60,
    )


@pytest.fixture(scope="module")
def tool_repo(tmp_path_factory):
    from .conftest import make_repo

    return make_repo(tmp_path_factory.mktemp("tools") / "repo")


@pytest.fixture(scope="module")
def local_sb(tool_repo):
    with open_sandbox("local", repo=tool_repo) as sb:
        yield sb


@pytest.fixture(scope="module")
def docker_sb(tool_repo, request):
    sb = open_backend("docker", tool_repo, request)
    yield sb
    sb.close()


@pytest.fixture(scope="module")
def test_label():
    return {"kvagent.test": "tools"}


@pytest.mark.parametrize("case", sorted(CASES))
def test_tool_local(local_sb, case):
    reset(local_sb)
    run_case(local_sb, CASES[case])


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_tool_docker_matches_local(local_sb, docker_sb, case):
    reset(local_sb)
    reset(docker_sb)
    assert run_case(docker_sb, CASES[case]) == run_case(local_sb, CASES[case])


def test_bash_timeout_is_reported(local_sb):
    r = local_sb.run_tool("execute_bash", {"cmd": "echo start; sleep 1000.123"}, timeout=1)
    assert r.exit_code == 124 and not r.timed_out
    assert r.output.startswith("Exit code: 124\n") and "start" in r.output
    assert "ERROR: the command timed out after 1 seconds" in r.output


def test_bash_output_capped(local_sb):
    r = local_sb.run_tool("execute_bash", {"cmd": "yes abcdefgh | head -c 5000000; printf '\\xff'"})
    assert r.exit_code == 0 and len(r.output) < 120_000 and "more bytes not shown" in r.output


def test_search_caps_file_count(local_sb):
    reset(local_sb)
    local_sb.run("mkdir many && for i in $(seq 1 120); do echo needle > many/f$i.txt; done", timeout=60)
    r = local_sb.run_tool("search", {"search_term": "needle", "path": "many"})
    assert r.output.startswith('More than 100 files matched for "needle" in many. Please narrow your search')
    reset(local_sb)


def test_large_file_text_goes_through(local_sb):
    reset(local_sb)
    text = "".join(f"line {i} " + "x" * 100 + "\n" for i in range(3000))  # > 128 KiB argv limit
    r = local_sb.run_tool(FE, {"command": "create", "path": "big.txt", "file_text": text})
    assert r.exit_code == 0 and "<response clipped>" in r.output
    assert local_sb.read("big.txt") == text
    reset(local_sb)


def test_bad_tool_name_and_params(local_sb):
    with pytest.raises(SandboxError, match="unknown tool"):
        local_sb.run_tool("rm_rf", {})
    with pytest.raises(SandboxError, match="str -> str"):
        local_sb.run_tool(FE, {"command": "insert", "insert_line": 3})


STDLIB_USED = {"ast", "contextlib", "json", "os", "re", "shlex", "signal", "subprocess", "sys", "threading"}


@pytest.mark.parametrize("name", [*TOOL_NAMES, "_toolkit"])
def test_tool_scripts_are_python37_stdlib(name):
    src = (TOOLS_SRC / f"{name}.py").read_text()
    ast.parse(src, feature_version=(3, 7))  # no walrus, match, etc.
    imported = set(re.findall(r"^(?:import|from) (\w+)", src, re.MULTILINE))
    # the scripts may also import the shared helper module that both backends install beside them
    assert imported <= (STDLIB_USED if name == "_toolkit" else STDLIB_USED | {"_toolkit"})
    assert "removeprefix" not in src and "shlex.join" not in src


def installed_tools(sb) -> list[str]:
    return sb.run(f"cd {sb.tools_dir} && ls *.py", timeout=60).output.split()


def test_local_installs_the_helper_module(local_sb):
    assert installed_tools(local_sb) == sorted([*(f"{n}.py" for n in TOOL_NAMES), "_toolkit.py"])


@pytest.mark.slow
def test_docker_installs_what_local_does(local_sb, docker_sb):
    assert installed_tools(docker_sb) == installed_tools(local_sb)
