"""What the model reads after each call: the tool output (capped), and the step budget line."""

from __future__ import annotations

from typing import Any

FINISHED = "<<< Finished >>>"
MAX_OUTPUT_LINES = 80  # bash outputs longer than this keep their head and tail
KEEP_LINES = 40


def truncate_lines(text: str, max_lines: int = MAX_OUTPUT_LINES, keep: int = KEEP_LINES) -> str:
    """Longer than `max_lines` lines: the first and last `keep` lines around one marker line."""
    lines = text.split("\n")
    if len(lines) <= max_lines:
        return text
    cut = len(lines) - 2 * keep
    marker = f"[... {cut} lines truncated; narrow the command (grep, head, tail) to see them ...]"
    return "\n".join([*lines[:keep], marker, *lines[-keep:]])


def tool_observation(name: str, result: Any, timeout: float) -> str:
    """Observation for a tool result (`exit_code`, `output`, `timed_out`), as R2E-Gym shows it."""
    if name == "finish":
        return FINISHED
    output = str(result.output).rstrip("\n")
    if name == "execute_bash":
        # The sandbox's bash script prints its own `Exit code: C` header; add it only if absent.
        if not output.startswith("Exit code:"):
            output = f"Exit code: {result.exit_code}\nExecution output of [execute_bash]:\n{output}"
        if result.timed_out:
            output += f"\nThe command timed out after {timeout:g} seconds and was stopped."
        return truncate_lines(output)
    if result.timed_out:
        output += f"\nThe {name} call timed out after {timeout:g} seconds and was stopped."
    return f"Execution output of [{name}]:\n{output}"


def steps_notice(
    steps_used: int,
    max_steps: int,
    soft_limit: int | None,
    urge_remaining: int,
    template: str = "Steps Remaining: {remaining}",
    final: str = "You are close to the step limit. Submit your answer now by calling `finish`.",
) -> str:
    """`Steps Remaining: N`, plus an order to submit past the soft limit or near the hard one (both
    wordings can come from a prompt file)."""
    remaining = max_steps - steps_used
    notice = template.format(remaining=remaining)
    if (soft_limit is not None and steps_used > soft_limit) or remaining <= urge_remaining:
        notice += f"\n{final}"
    return notice


def with_steps_notice(message: str, notice: str) -> str:
    return f"{message}\n\n{notice}"
