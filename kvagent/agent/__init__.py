"""kvagent.agent: the DeepSWE / R2E-Gym coding agent over one append-only token stream.

result = run_episode(session, env, issue_text, AgentConfig(), tokenizer=engine.tokenizer)
result = solve_episode(engine, env, issue_text, cache_config=..., trajectory_path="run.traj.json")
chat = ChatAgent(session, env, tokenizer, on_text=print); chat.ask("..."); chat.ask("and then ...")
R2E-Gym's whole protocol (docs/deepswe.md): AgentConfig(scaffold="r2egym", r2egym_path="~/src/R2E-Gym")
"""

from kvagent.agent.chat import ChatAgent
from kvagent.agent.config import AgentConfig
from kvagent.agent.interfaces import Engine, Environment, Generated, ModelSession, ToolResult
from kvagent.agent.loop import EXIT_STATUSES, Agent, AgentEvent, EpisodeResult, Turn, run_episode
from kvagent.agent.observation import FINISHED, steps_notice, tool_observation, truncate_lines
from kvagent.agent.parser import ToolCall, ToolCallError, parse_call
from kvagent.agent.prompt_file import PromptFile, load_prompt_file
from kvagent.agent.prompts import INSTANCE_STYLES, extract_issue, instance_prompt, system_prompt
from kvagent.agent.render import ChatMLRenderer
from kvagent.agent.scaffold import R2EGymScaffold, Scaffold, make_scaffold
from kvagent.agent.solve import solve_episode
from kvagent.agent.tools import TOOLS, Param, ToolSpec
from kvagent.agent.trajectory import (
    iter_trajectories,
    load_trajectory,
    trajectory_dict,
    write_json_atomic,
    write_trajectory,
)

__all__ = [
    "EXIT_STATUSES",
    "FINISHED",
    "INSTANCE_STYLES",
    "TOOLS",
    "Agent",
    "AgentConfig",
    "AgentEvent",
    "ChatAgent",
    "ChatMLRenderer",
    "Engine",
    "Environment",
    "EpisodeResult",
    "Generated",
    "ModelSession",
    "Param",
    "PromptFile",
    "R2EGymScaffold",
    "Scaffold",
    "ToolCall",
    "ToolCallError",
    "ToolResult",
    "ToolSpec",
    "Turn",
    "extract_issue",
    "instance_prompt",
    "iter_trajectories",
    "load_prompt_file",
    "load_trajectory",
    "make_scaffold",
    "parse_call",
    "run_episode",
    "solve_episode",
    "steps_notice",
    "system_prompt",
    "tool_observation",
    "trajectory_dict",
    "truncate_lines",
    "write_json_atomic",
    "write_trajectory",
]
