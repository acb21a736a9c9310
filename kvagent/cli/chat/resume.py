"""`kvagent chat --session FILE`: the chat is saved when it ends, and the next `kvagent chat` with the
same FILE continues it where it was, with the bounded cache it had.

FILE is the model session (`Session.save`, runtime/persist.py: the evicted cache and everything
that decides the next token, exactly); FILE.chat.json beside it is the agent's side: the
conversation (messages, turns, the counters and the last reply's ids its next user turn is
rendered after) and the patch of the sandbox copy, which the new copy gets back so the agent's
edits are where its conversation says they are. The repository copied is the one given now."""

from __future__ import annotations

import base64
import dataclasses
import json
from pathlib import Path
from typing import Any

from kvagent.agent.episode import Turn
from kvagent.errors import ConfigError
from kvagent.fileio import atomic_write_json

# The agent's state that its next request reads (agent/loop.py, agent/chat.py): read and written
# here by name, so the agent keeps no persistence code of its own.
AGENT_FIELDS = ("messages", "prompt_tokens", "forgotten", "first_step", "requests", "_reply_start",
                "_last_reply_ids", "_prepared")  # fmt: skip
MAX_PATCH = 100_000  # bytes: the patch travels as one shell argument (Linux caps one at 128 KiB)


def sidecar(path: str | Path) -> Path:
    return Path(f"{path}.chat.json")


def save_chat(chat: Any, path: str | Path) -> int:
    """Write the chat's session and its agent's side; returns the session file's bytes."""
    agent = chat.agent
    state = {name: getattr(agent, name) for name in AGENT_FIELDS}
    state["turns"] = [dataclasses.asdict(t) for t in agent.turns]
    size = chat.session.save(path)
    atomic_write_json(sidecar(path), {"agent": state, "patch": chat.env.diff() or ""}, default=None)
    return size


def resume_chat(chat: Any, path: str | Path) -> None:
    """Give a new chat (its session already loaded from `path`) the agent's side and the patch."""
    try:
        saved = json.loads(sidecar(path).read_text(encoding="utf-8"))
        state = saved["agent"]
        turns = [Turn(**t) for t in state["turns"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(
            f"session: {sidecar(path)} is missing or damaged ({type(e).__name__}); start a new chat "
            "with another --session file"
        ) from None
    agent = chat.agent
    for name in AGENT_FIELDS:
        setattr(agent, name, state[name])
    agent.turns = turns
    patch = saved["patch"].encode("utf-8")
    if not patch:
        return
    if len(patch) > MAX_PATCH:
        raise ConfigError(
            f"session: the saved patch is {len(patch)} bytes, over {MAX_PATCH}; apply it by hand"
        )
    r = chat.env.run(f"echo {base64.b64encode(patch).decode()} | base64 -d | git apply --whitespace=nowarn -")
    if r.exit_code != 0:
        raise ConfigError(
            f"session: the saved patch does not apply to this repository ({r.output.strip()[-200:]}); "
            "run the chat on the repository it was saved from"
        )
