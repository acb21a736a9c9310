import re

import pytest

from kvagent.agent.config import AgentConfig
from kvagent.agent.prompts import INSTANCE_STYLES, extract_issue, instance_prompt, system_prompt
from kvagent.agent.tools import TOOLS
from kvagent.errors import ConfigError, KvagentError


def test_system_prompt_has_one_framed_block_per_tool_in_order():
    text = system_prompt()
    begins = re.findall(r"^---- BEGIN FUNCTION #(\d+): (\w+) ----$", text, re.M)
    ends = re.findall(r"^---- END FUNCTION #(\d+) ----$", text, re.M)
    assert begins == [("1", "file_editor"), ("2", "execute_bash"), ("3", "search"), ("4", "finish")]
    assert ends == ["1", "2", "3", "4"]
    for k, spec in enumerate(TOOLS, 1):
        block = text.split(f"---- BEGIN FUNCTION #{k}: {spec.name} ----")[1].split(
            f"---- END FUNCTION #{k} ----"
        )[0]
        assert "Description:" in block and "Parameters:" in block
        for p in spec.params:
            need = "required" if p.required else "optional"
            assert f"{p.name} ({p.type}, {need})" in block


def test_tool_contract():
    specs = {t.name: t for t in TOOLS}
    editor = specs["file_editor"]
    assert editor.param_names == (
        "command", "path", "file_text", "old_str", "new_str", "insert_line", "view_range", "concise",
    )  # fmt: skip
    assert editor.param("command").choices == ("view", "create", "str_replace", "insert", "undo_edit")
    assert specs["execute_bash"].required == ("cmd",)
    assert specs["search"].required == ("search_term",) and specs["search"].param("path").default == "."
    assert specs["finish"].param("command").choices == ("submit",)


def test_system_prompt_gives_call_format_and_reminders():
    text = system_prompt()
    tail = text.split("---- END FUNCTION #4 ----")[1]
    assert "<function=example_function_name>" in tail and "</parameter>" in tail and "</function>" in tail
    assert "exactly one function" in tail
    assert "start with <function=" in tail and "end with </function>" in tail
    assert "reasoning" in tail


@pytest.mark.parametrize("style", list(INSTANCE_STYLES))
def test_instance_prompt_styles(style):
    text = instance_prompt("Division by zero in mean()", style=style, repo_dir="/work/repo")
    assert "<github_issue>\nDivision by zero in mean()\n</github_issue>" in text
    assert "/work/repo" in text
    steps = re.findall(r"^(\d)\. (.*)$", text, re.M)
    assert [n for n, _ in steps] == ["1", "2", "3", "4", "5", "6"]
    assert "reproduce" in steps[1][1].lower() and "finish" in steps[5][1]


def test_default_style_is_repository_first():
    text = instance_prompt("x")
    assert text.index("/testbed") < text.index("<github_issue>")
    issue_first = instance_prompt("x", style="issue_first")
    assert issue_first.index("<github_issue>") < issue_first.index("/testbed")


def test_issue_tags_are_extracted():
    statement = "Title\n[ISSUE]\nmean() is off by one\n[/ISSUE]\nhints: none"
    assert extract_issue(statement) == "mean() is off by one"
    assert extract_issue("  plain text  ") == "plain text"
    assert "hints" not in instance_prompt(statement)


def test_dollar_signs_in_the_issue_are_kept():
    assert "costs $5 and ${x}" in instance_prompt("costs $5 and ${x}")


def test_unknown_style_is_a_clear_error():
    with pytest.raises(KvagentError, match="prompt style 'chatty' is unknown"):
        instance_prompt("x", style="chatty")
    with pytest.raises(ConfigError, match="prompt_style"):
        AgentConfig(prompt_style="chatty")


@pytest.mark.parametrize(
    "kw, field", [({"temperature": -1.0}, "temperature"), ({"top_p": 0.0}, "top_p"), ({"top_k": -2}, "top_k")]
)
def test_bad_sampling_fails_when_the_config_is_made(kw, field):
    # Not at the first reply, after the model loaded and the sandbox opened.
    with pytest.raises(ConfigError, match=field):
        AgentConfig(**kw)
