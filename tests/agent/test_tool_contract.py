"""The agent's tool specs and the sandbox's tool scripts name the same tools: a tool the model is
told about always has a script behind it, and no script goes untold."""

from kvagent.agent.tools import TOOLS
from kvagent.sandbox import TOOL_NAMES
from kvagent.sandbox.base import TOOLS_SRC


def test_agent_specs_name_exactly_the_sandbox_tools():
    assert sorted(t.name for t in TOOLS) == sorted(TOOL_NAMES)


def test_every_sandbox_tool_has_its_script():
    assert all((TOOLS_SRC / f"{name}.py").is_file() for name in TOOL_NAMES)
