import pytest

from kvagent.agent.parser import ToolCallError, parse_call
from kvagent.agent.tools import TOOLS, Param, ToolSpec

# DeepSWE-shaped reply: thinking, a sentence, then one call with a multi-line parameter.
DEEPSWE_EDIT = """<think>
The bug is the `+ 1` in the denominator. I will replace that line.
</think>
Let me fix the denominator.

<function=file_editor>
  <parameter=command>str_replace</parameter>
  <parameter=path>/testbed/calc/__init__.py</parameter>
  <parameter=old_str>    total = sum(values)
    return total / (len(values) + 1)</parameter>
  <parameter=new_str>
    total = sum(values)
    return total / len(values)
  </parameter>
</function>"""

# Real replies from R2E-Gym rollouts (SWE-Master fork, tool names str_replace_editor / execute_bash with
# `command`), copied verbatim from public trajectories; they exercise parsing of real shapes.
REAL_STR_REPLACE = (
    "<think>I have a simple import error in my test. I need to import the Table class in the test. Let me fix "
    "that.</think>\nI need to fix the import in the test:\n\n<function=str_replace_editor>\n  <parameter=command>"
    "str_replace</parameter>\n  <parameter=path>/testbed/Orange/data/tests/test_pandas.py</parameter>\n  "
    "<parameter=old_str>import unittest\nimport numpy as np\nfrom Orange.data import ContinuousVariable, "
    "DiscreteVariable, TimeVariable</parameter>\n  <parameter=new_str>import unittest\nimport numpy as np\nfrom "
    "Orange.data import ContinuousVariable, DiscreteVariable, TimeVariable, Table</parameter>\n</function>"
)
REAL_BASH = (
    "<think>I can see that the file is quite long and I need to find the `scatter` method. Let me use grep to "
    'search for it specifically.</think>\n\n<function=execute_bash>\n  <parameter=command>grep -n "scatter" '
    "/testbed/verde/base/base_classes.py</parameter>\n</function>"
)
FORK_TOOLS = (
    ToolSpec(
        "str_replace_editor",
        "",
        (
            Param("command", "string", "", True),
            Param("path", "string", "", True),
            Param("old_str", "string", ""),
            Param("new_str", "string", ""),
        ),
    ),  # fmt: skip
    ToolSpec("execute_bash", "", (Param("command", "string", "", True),)),
)


def test_multiline_parameters_are_kept_and_stripped():
    call = parse_call(DEEPSWE_EDIT)
    assert call.name == "file_editor"
    assert call.params == {
        "command": "str_replace",
        "path": "/testbed/calc/__init__.py",
        "old_str": "total = sum(values)\n    return total / (len(values) + 1)",
        "new_str": "total = sum(values)\n    return total / len(values)",
    }
    assert call.text.startswith("<function=file_editor>") and call.text.endswith("</function>")


def test_real_r2e_replies_parse_with_their_own_tool_set():
    call = parse_call(REAL_STR_REPLACE, FORK_TOOLS)
    assert call.name == "str_replace_editor"
    assert call.params["old_str"].splitlines() == [
        "import unittest",
        "import numpy as np",
        "from Orange.data import ContinuousVariable, DiscreteVariable, TimeVariable",
    ]
    assert call.params["new_str"].endswith("TimeVariable, Table")
    bash = parse_call(REAL_BASH, FORK_TOOLS)
    assert bash.params == {"command": 'grep -n "scatter" /testbed/verde/base/base_classes.py'}


def test_real_r2e_replies_are_rejected_by_the_deepswe_tool_set():
    with pytest.raises(ToolCallError, match="unknown function 'str_replace_editor'"):
        parse_call(REAL_STR_REPLACE)
    with pytest.raises(ToolCallError, match="has no parameter 'command'"):
        parse_call(REAL_BASH)


def test_first_of_two_calls_wins():
    reply = (
        "<function=execute_bash>\n<parameter=cmd>ls</parameter>\n</function>\n"
        "<function=finish>\n<parameter=command>submit</parameter>\n</function>"
    )
    call = parse_call(reply)
    assert (call.name, call.params) == ("execute_bash", {"cmd": "ls"})


def test_a_function_mention_in_thinking_does_not_swallow_the_call():
    reply = (
        "<think>Maybe <function=finish> now? No, run the tests first.</think>\n"
        "<function=execute_bash><parameter=cmd>pytest -q</parameter></function>"
    )
    call = parse_call(reply)
    assert (call.name, call.params) == ("execute_bash", {"cmd": "pytest -q"})


def test_whitespace_tolerance_and_defaults():
    call = parse_call("<function= search >\n<parameter= search_term >  mean \n</parameter>\n</function>")
    assert (call.name, call.params) == ("search", {"search_term": "mean", "path": "."})


@pytest.mark.parametrize(
    ("reply", "problem"),
    [
        ("<think>I should look at the code.</think>\nLet me look at the code.", "contains no function call"),
        ("<function=execute_bash>\n<parameter=cmd>ls</parameter>\n", "not closed with </function>"),
        ("done </function>", "without an opening"),
        ("<function=>\n<parameter=cmd>ls</parameter>\n</function>", "malformed function header"),
        ("<function=execute_bash>\n<parameter=cmd>ls\n</function>", "malformed parameter"),
        (
            "<function=execute_bash>\n<parameter=cmd>ls</parameter><parameter=cmd>pwd</parameter></function>",
            "twice",
        ),
        (
            "<function=run_python>\n<parameter=code>1</parameter>\n</function>",
            "unknown function 'run_python'",
        ),
        (
            "<function=file_editor>\n<parameter=command>view</parameter>\n</function>",
            "missing its required parameter 'path'",
        ),
        (
            "<function=execute_bash>\n<parameter=cmd>  </parameter>\n</function>",
            "missing its required parameter 'cmd'",
        ),
        ("<function=finish>\n<parameter=command>quit</parameter>\n</function>", "must be one of submit"),
    ],
)
def test_bad_calls_become_an_error_observation(reply, problem):
    with pytest.raises(ToolCallError) as info:
        parse_call(reply)
    assert problem in info.value.problem
    observation = str(info.value)
    assert observation.startswith("ERROR: ")
    assert "You must call exactly one function" in observation
    assert "<function=NAME>" in observation and "</function>" in observation
    assert all(t.name in observation for t in TOOLS)
