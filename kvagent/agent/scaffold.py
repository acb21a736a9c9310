"""Protocol profiles: what the model reads and how its replies are read, selectable per episode.

`kvagent` (the default) is kvagent's own, stricter protocol; `r2egym` follows R2E-Gym's evaluation
code (the setting of DeepSWE-Preview's published score), odd corners included: see r2egym.py and
docs/deepswe.md. The loop asks its profile for the prompts, the step notice, the reading of a reply,
the tool to run and the observation; everything else (the token stream, the cache) is shared."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvagent.agent import r2egym
from kvagent.agent.observation import steps_notice, tool_observation, with_steps_notice
from kvagent.agent.parser import ToolCall, ToolCallError, parse_call
from kvagent.agent.prompt_file import FINAL_STEPS_NOTICE, STEPS_REMAINING, PromptFile
from kvagent.agent.prompts import extract_issue, instance_prompt, system_prompt
from kvagent.agent.tools import FINISH_TOOL
from kvagent.errors import KvagentError

NO_CALL = "no function call"


@dataclass(frozen=True)
class Reading:
    """A reply as the profile reads it. `call` None: no usable call; `observation` set: the call is
    not run and this is what the model reads instead."""

    call: ToolCall | None
    observation: str | None = None
    problem: str | None = None  # why it did not run (the turn's call_error)


class Scaffold:
    """kvagent's protocol: calls validated against the tool specs, `Steps Remaining` against the hard
    limit, a reply ends at `</function>` (config.stop's default)."""

    name = "kvagent"
    tool_dir = ""  # sandbox tool scripts: "" = kvagent's, "r2egym" = tools/r2egym/
    token_rule_after_step = False  # R2E-Gym checks the token limit after the tool ran

    def __init__(self, config: Any, prompts: PromptFile | None = None) -> None:
        self.config, self.prompts = config, prompts

    # ------------------------------------------------------------------ prompts and notices
    def system(self) -> str:
        return self.prompts.system_prompt if self.prompts else system_prompt()  # type: ignore[return-value]

    def instance(self, issue_text: str, repo_dir: str) -> str:
        if self.prompts:
            return self.prompts.instance(self.problem_statement(issue_text), repo_dir)
        return instance_prompt(issue_text, self.config.prompt_style, repo_dir)

    def problem_statement(self, issue_text: str) -> str:
        return extract_issue(issue_text)

    def notice(self, steps_used: int) -> str:
        c, p = self.config, self.prompts
        return steps_notice(
            steps_used, c.max_steps, c.soft_step_limit, c.urge_remaining,
            template=p and p.steps_remaining or STEPS_REMAINING,
            final=p and p.final_steps_notice or FINAL_STEPS_NOTICE,
        )  # fmt: skip

    def attach(self, message: str, notice: str) -> str:
        return with_steps_notice(message, notice)

    @property
    def stop(self) -> tuple[str, ...]:
        """The stop strings of every reply, for every command (solve, eval, chat): the config's,
        whose default is the scaffold's (`</function>` here; none under R2E-Gym's, where a reply
        runs to end of turn)."""
        return tuple(self.config.stop)

    # ------------------------------------------------------------------ calls and observations
    def read(self, reply: str) -> Reading:
        try:
            return Reading(parse_call(reply))
        except ToolCallError as e:
            no_call = "<function=" not in reply and "</function>" not in reply
            if no_call and self.prompts and self.prompts.no_call_message is not None:
                return Reading(None, self.prompts.no_call_message, e.problem)
            return Reading(None, str(e), e.problem)

    def tool(self, name: str) -> str:
        return f"{self.tool_dir}/{name}" if self.tool_dir else name

    def prepare(self, env: Any) -> None:
        """Before the first call: install the tools the protocol brings (none here)."""

    def run(self, env: Any, call: ToolCall, timeout: float) -> Any:
        return env.run_tool(self.tool(call.name), call.params, timeout=timeout)

    def observe(self, name: str, result: Any, timeout: float) -> str:
        return tool_observation(name, result, timeout)

    def ends(self, call: dict[str, Any] | None) -> bool:
        return bool(call) and call["name"] == FINISH_TOOL  # type: ignore[index]


class R2EGymScaffold(Scaffold):
    """R2E-Gym's protocol (agenthub, `--scaffold r2egym --use_fn_calling False`)."""

    name = "r2egym"
    tool_dir = "r2egym"
    token_rule_after_step = True

    def problem_statement(self, issue_text: str) -> str:
        return r2egym.task_instruction(issue_text)

    def notice(self, steps_used: int) -> str:
        c, p = self.config, self.prompts
        soft = c.soft_step_limit if c.soft_step_limit is not None else c.max_steps
        return r2egym.steps_line(
            steps_used, soft,
            p and p.steps_remaining or STEPS_REMAINING,
            p and p.final_steps_notice or FINAL_STEPS_NOTICE,
        )  # fmt: skip

    def attach(self, message: str, notice: str) -> str:
        return r2egym.with_steps_line(message, notice)

    def read(self, reply: str) -> Reading:
        action = r2egym.parse_action(reply)
        if not action.name:
            return Reading(None, self._no_call(), NO_CALL)
        call = ToolCall(action.name, action.params)
        if not action.known:
            return Reading(
                call, r2egym.unknown_tool_observation(action.name), f"unknown function {action.name!r}"
            )
        return Reading(call)

    def prepare(self, env: Any) -> None:
        """R2E-Gym's task interpreter link; with --r2egym, its own tool scripts, installed as its
        runtime installs them."""
        scripts = self.config.tool_scripts
        if scripts and not hasattr(env, "install_commands"):
            raise KvagentError(
                f"{type(env).__name__} cannot install R2E-Gym's tools from --r2egym; use a sandbox "
                "(kvagent.sandbox.open_sandbox) or drop --r2egym"
            )
        if hasattr(env, "link_task_venv"):  # /root/.venv as R2E-Gym links it, for either tool set
            env.link_task_venv()
        wheels = self.config.tool_wheels
        if scripts and wheels and hasattr(env, "provide_module"):  # R2E-Gym's `pip install chardet`
            env.provide_module("chardet", dict(wheels))
        if scripts:
            env.install_commands(dict(scripts))

    def run(self, env: Any, call: ToolCall, timeout: float) -> Any:
        """R2E-Gym's scripts run as its runtime runs them (`timeout T NAME ARGS`, PATH only);
        without a checkout, kvagent's re-implementation of them (sandbox/tools/r2egym/)."""
        if not self.config.tool_scripts:
            return super().run(env, call, timeout)
        return env.run_command(r2egym.bash_command(call.name, call.params), timeout=timeout)

    def _no_call(self) -> str:
        if self.prompts and self.prompts.no_call_message is not None:
            return self.prompts.no_call_message
        return str(ToolCallError("your reply contains no function call."))

    def observe(self, name: str, result: Any, timeout: float) -> str:
        output, code = r2egym.runtime_output(result, timeout)
        return r2egym.observation(name, output, code)

    def ends(self, call: dict[str, Any] | None) -> bool:
        return bool(call) and r2egym.Action(call["name"]).ends_episode  # type: ignore[index]


def make_scaffold(config: Any) -> Scaffold:
    cls = R2EGymScaffold if config.scaffold == "r2egym" else Scaffold
    return cls(config, config.prompt_file())
