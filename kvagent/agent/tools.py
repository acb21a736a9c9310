"""The agent's tool set (DeepSWE / R2E-Gym contract): one spec per function, used both to write the
system prompt and to validate parsed calls, so the two can never disagree."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Param:
    name: str
    type: str  # as shown to the model: string, integer, array, boolean
    description: str
    required: bool = False
    choices: tuple[str, ...] = ()  # allowed values, when the parameter is an enum
    default: str | None = None  # filled in by the parser when the model omits the parameter


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    params: tuple[Param, ...]

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    @property
    def required(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params if p.required)

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)


FILE_EDITOR = ToolSpec(
    name="file_editor",
    description=(
        "View, create and edit files in the repository.\n"
        "* State persists between calls.\n"
        "* `view` on a file prints it with line numbers (`cat -n` style); on a directory it lists files "
        "up to two levels deep.\n"
        "* `create` writes `file_text` to a new file; it fails if `path` already exists.\n"
        "* `str_replace` replaces `old_str` by `new_str`; `old_str` must match exactly one place in the "
        "file, whitespace included, so give enough surrounding lines to make it unique.\n"
        "* `insert` adds `new_str` after line `insert_line`.\n"
        "* `undo_edit` reverts the last edit made to `path`.\n"
        "* Long outputs are shortened; use `view_range` or `search` to see the part you need."
    ),
    params=(
        Param(
            "command",
            "string",
            "The operation: `view`, `create`, `str_replace`, `insert` or `undo_edit`.",
            required=True,
            choices=("view", "create", "str_replace", "insert", "undo_edit"),
        ),
        Param(
            "path", "string", "Absolute path of the file or directory, e.g. `/testbed/pkg/module.py`.", True
        ),
        Param("file_text", "string", "Content of the new file (required by `create`)."),
        Param("old_str", "string", "The exact text to replace (required by `str_replace`)."),
        Param("new_str", "string", "The replacement text (`str_replace`) or the text to insert (`insert`)."),
        Param(
            "insert_line", "integer", "Line number after which `new_str` is inserted (required by `insert`)."
        ),
        Param(
            "view_range", "array", "Lines to show with `view`, e.g. `[10, 40]`; `[10, -1]` shows to the end."
        ),
        Param(
            "concise", "boolean", "With `view` on a Python file, show a condensed outline of its structure."
        ),
    ),
)

EXECUTE_BASH = ToolSpec(
    name="execute_bash",
    description=(
        "Run a bash command in the repository's environment and return its exit code and output.\n"
        "* Commands that run longer than the time limit are stopped.\n"
        "* Interactive commands are not supported; pass flags that avoid prompts.\n"
        "* Very long outputs are shortened to their first and last lines."
    ),
    params=(Param("cmd", "string", "The bash command to run.", required=True),),
)

SEARCH = ToolSpec(
    name="search",
    description=(
        "Search for a term in a file or in every file of a directory, and list where it occurs.\n"
        "* In a directory: the files that contain the term, with match counts.\n"
        "* In a file: the matching lines with their line numbers."
    ),
    params=(
        Param("search_term", "string", "The text to look for.", required=True),
        Param(
            "path",
            "string",
            "File or directory to search in; defaults to the current directory.",
            default=".",
        ),
    ),
)

FINISH = ToolSpec(
    name="finish",
    description=(
        "Submit your work and end the task. Call it once the fix is in place and verified; the changes in "
        "the repository are your answer."
    ),
    params=(
        Param("command", "string", "Must be `submit`.", required=True, choices=("submit",)),
        Param("result", "string", "Optional short summary of what you changed and why."),
    ),
)

# Order matters: it is the FUNCTION #k numbering in the system prompt.
TOOLS: tuple[ToolSpec, ...] = (FILE_EDITOR, EXECUTE_BASH, SEARCH, FINISH)
FINISH_TOOL = FINISH.name
