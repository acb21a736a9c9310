"""Deterministic generated episodes: a scripted agent makes real tool calls (view, search, run tests,
edit) in a local sandbox over a repository, so every observation is real tool output.

Same seed -> same messages (and so the same token stream): sandbox paths are shown as /testbed and
test timings are blanked. The seed picks the planted fact's value, the exploration order, the filler
calls and the wording of the reasoning."""

from __future__ import annotations

import random
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvagent.bench.episodes import DEFAULT_FACT, Episode, Probe, default_probe, render_tool_call
from kvagent.bench.fixture_repo import BUGGY_LINE, FIXED_LINE, ISSUE, write_fixture_repo
from kvagent.errors import ConfigError

NOTES_PATH = "docs/DEPLOY_NOTES.md"
REPO_DIR = "/testbed"
_TIMING = re.compile(r"(Ran \d+ tests? in )\d+\.\d+s")
MIN_TURNS = 10  # the fixed part of the script: explore, notes, fix, test, finish

_THOUGHTS = {
    "explore": [
        "Let me start by looking at how the repository is laid out.",
        "First I want an overview of the files in the repository.",
    ],
    "notes": [
        "There is a notes file in docs; it may say how this project is released, so I will read it.",
        "Before changing code I will skim the deployment notes to learn the project's conventions.",
    ],
    "search": [
        "I will search for where parse_duration is defined and used.",
        "Let me find every place that mentions parse_duration.",
    ],
    "view_parse": [
        "Now let me read the parser itself.",
        "The bug is most likely in durations/parse.py; let me view it.",
    ],
    "repro": [
        "I will write a script that reproduces the issue.",
        "Let me reproduce the problem with a tiny script first.",
    ],
    "run_repro": ["Run the reproduction script.", "Let me run it to see the wrong result."],
    "fix": [
        "The loop assigns `total` instead of adding to it, so only the last part counts. Fix it.",
        "Found it: `total = ...` overwrites the running sum on every part; it must be `+=`.",
    ],
    "rerun": ["Re-run the reproduction script to confirm the fix.", "Check the script again after the fix."],
    "tests": ["Now run the whole test suite.", "Let me run the unit tests to make sure nothing else broke."],
    "filler": [
        "Let me look at this part as well before going on.",
        "I want to double-check how this piece fits in.",
        "This might matter for edge cases; let me check it.",
        "To be thorough, I will inspect this too.",
    ],
    "finish": ["The fix works and the tests pass, so I will submit.", "Everything passes now; submitting."],
}

_REPRO = """from durations import parse_duration

for text, expected in [("1h30m", 5400), ("1d2h3m4s", 93784), ("45s", 45)]:
    got = parse_duration(text)
    print(text, got, "OK" if got == expected else f"WRONG (expected {expected})")
"""


# A short stand-in for the agent's ~1,000-token system prompt, for small-budget runs (the demo): same
# tools and call format, a tenth of the tokens.
COMPACT_SYSTEM = """You are a software engineering agent in a code repository. Call exactly one function per reply:
file_editor (command: view | create | str_replace | insert | undo_edit; path; file_text; old_str; new_str;
insert_line; view_range), execute_bash (cmd), search (search_term; path), finish (command: submit; result).
Format:
<function=NAME>
<parameter=KEY>value</parameter>
</function>
Explain your reasoning before the call. Submit with finish when the task is solved."""
PROMPTS = ("agent", "compact")


def fact_value(seed: int) -> str:
    if seed == 0:
        return DEFAULT_FACT[1]
    rng = random.Random(f"fact-{seed}")
    return f"{rng.randint(1000, 9999)}-{''.join(rng.choice('ABCDEFGHJKMNPQRSTUVWXYZ') for _ in range(3))}"


# The planted fact's forms: `key` (the default, as in planted real trajectories) and `port`, which the
# bundled SmolLM2-135M retrieves with the full cache (log p about -0.1 per value token; it does not
# retrieve the key, answering "The deploy key is:" and a tool call instead), so the demo can show
# which evicting runs lose it.
FACTS = ("key", "port")


def planted_fact(fact: str, seed: int) -> tuple[str, Probe]:
    """(the notes' sentence stating the fact, the probe asking for it at the end)."""
    if fact == "key":
        value = fact_value(seed)
        return (
            f"For the staging upload, {DEFAULT_FACT[0]} {value}. Do not paste it into issues.",
            default_probe(value),
        )
    value = "8471" if seed == 0 else str(random.Random(f"port-{seed}").randint(1024, 9999))
    probe = Probe(
        question="Which port does the staging server listen on?",
        answer_prefix="The staging server listens on port",
        value=value,
    )
    return f"The staging server listens on port {value}.", probe


def _notes(sentence: str) -> str:
    return (
        "# Deployment notes\n\n"
        "Releases are cut from the main branch after the test suite passes.\n"
        f"{sentence}\n"
        "Tag releases as vMAJOR.MINOR.PATCH and update setup.cfg first.\n"
    )


def _filler_pool(fixture: bool) -> list[tuple[str, dict[str, str]]]:
    pool = [
        ("execute_bash", {"cmd": "git status --short"}),
        ("execute_bash", {"cmd": "git log --oneline -n 5"}),
        ("execute_bash", {"cmd": "find . -name '*.py' -not -path './.git/*' | sort"}),
        ("execute_bash", {"cmd": "wc -l $(git ls-files '*.py') | tail -n 15"}),
        ("file_editor", {"command": "view", "path": "README.md"}),
        ("search", {"search_term": "def ", "path": "."}),
        ("search", {"search_term": "import", "path": "."}),
    ]
    if fixture:
        pool += [
            ("file_editor", {"command": "view", "path": "durations/format.py"}),
            ("file_editor", {"command": "view", "path": "durations/cli.py"}),
            ("file_editor", {"command": "view", "path": "durations/__init__.py"}),
            ("file_editor", {"command": "view", "path": "tests/test_format.py"}),
            ("file_editor", {"command": "view", "path": "setup.cfg"}),
            ("search", {"search_term": "DurationError", "path": "."}),
            ("execute_bash", {"cmd": "python -m durations.cli 1h30m 2d 10x"}),
            (
                "execute_bash",
                {"cmd": "python -c 'from durations import format_duration; print(format_duration(93784))'"},
            ),
            ("file_editor", {"command": "view", "path": "durations/parse.py", "view_range": "[13, 28]"}),
        ]
    return pool


def _script(rng: random.Random, turns: int, fact_turn: int, fixture: bool) -> list[tuple[str, str, dict]]:
    """(thought key, tool, params) for every turn, the planted-notes view at index `fact_turn`."""
    core_head = [("explore", "file_editor", {"command": "view", "path": "."})]
    if fixture:
        core_head += [
            ("search", "search", {"search_term": "parse_duration", "path": "."}),
            ("view_parse", "file_editor", {"command": "view", "path": "durations/parse.py"}),
        ]
        core_tail = [
            (
                "repro",
                "file_editor",
                {"command": "create", "path": "reproduce_issue.py", "file_text": _REPRO},
            ),
            ("run_repro", "execute_bash", {"cmd": "python reproduce_issue.py"}),
            (
                "fix",
                "file_editor",
                {
                    "command": "str_replace",
                    "path": "durations/parse.py",
                    "old_str": BUGGY_LINE.strip(),
                    "new_str": FIXED_LINE.strip(),
                },
            ),
            ("rerun", "execute_bash", {"cmd": "python reproduce_issue.py"}),
            ("tests", "execute_bash", {"cmd": "python -m unittest -v 2>&1"}),
        ]
    else:
        core_head += [("search", "search", {"search_term": "def ", "path": "."})]
        core_tail = [("tests", "execute_bash", {"cmd": "git status --short && git diff --stat"})]
    finish = [("finish", "finish", {"command": "submit", "result": "Fixed compound durations."})]
    n_fill = max(0, turns - len(core_head) - len(core_tail) - len(finish) - 1)
    pool = _filler_pool(fixture)
    fillers = [("filler", *pool[rng.randrange(len(pool))]) for _ in range(n_fill)]
    split = rng.randint(0, n_fill)  # some exploration before the fix, the rest after it
    body = core_head + fillers[:split] + core_tail[:-1] + fillers[split:] + core_tail[-1:]
    notes = ("notes", "file_editor", {"command": "view", "path": NOTES_PATH})
    body.insert(max(0, min(fact_turn, len(body))), notes)
    return body + finish


def _clean(text: str, workdir: str) -> str:
    return _TIMING.sub(r"\g<1>0.000s", text.replace(workdir, REPO_DIR))


def generate_episode(
    seed: int = 0,
    turns: int = 24,
    fact_turn: int = 2,
    repo: str | None = None,
    prompt: str = "agent",
    *,
    open_env: Callable[[Path], Any] | None = None,
    fact: str = "key",
) -> Episode:
    """A `turns`-call episode (>= 10) over the built-in fixture repo, or over `repo` (any directory,
    e.g. an unpacked Flask sdist; then the calls are generic exploration). `prompt`: the agent's
    system prompt, or `compact` (COMPACT_SYSTEM). The calls really run, in `open_env(repo_dir)`: a
    sandbox (context manager) over a copy of the repository, e.g. a local one. `fact`: the planted
    fact's form (FACTS)."""
    from kvagent.agent.observation import tool_observation
    from kvagent.agent.prompts import instance_prompt, system_prompt

    if turns < MIN_TURNS:
        raise ConfigError(f"episodes: turns={turns} is too short; use turns >= {MIN_TURNS}")
    if prompt not in PROMPTS:
        raise ConfigError(f"episodes: prompt={prompt!r}; choose one of {', '.join(PROMPTS)}")
    if fact_turn < 0:
        raise ConfigError(f"episodes: fact_turn must be >= 0, got {fact_turn}")
    if fact not in FACTS:
        raise ConfigError(f"episodes: fact={fact!r}; choose one of {', '.join(FACTS)}")
    if open_env is None:
        raise ConfigError("episodes: a generated episode runs its calls in a sandbox; pass open_env")
    rng = random.Random(seed)
    sentence, probe = planted_fact(fact, seed)
    with tempfile.TemporaryDirectory(prefix="kvagent-bench-repo-") as tmp:
        if repo is None:
            src = write_fixture_repo(Path(tmp) / "durations")
            issue = ISSUE
        else:
            src = Path(repo).expanduser()
            if not src.is_dir():
                raise ConfigError(f"episodes: repo={repo} is not a directory")
            issue = "Review the repository's structure and report where its public API is defined."
        messages = [
            {"role": "system", "content": system_prompt() if prompt == "agent" else COMPACT_SYSTEM},
            {"role": "user", "content": instance_prompt(issue, repo_dir=REPO_DIR)},
        ]
        with open_env(src) as sb:
            sb.write(NOTES_PATH, _notes(sentence))
            for key, tool, params in _script(rng, turns, fact_turn, fixture=repo is None):
                thought = rng.choice(_THOUGHTS[key])
                call = {"name": tool, "arguments": params}
                messages.append({"role": "assistant", "content": f"{thought}\n\n{_render(call)}"})
                result = sb.run_tool(tool, params)
                obs = tool_observation(tool, result, timeout=90)
                messages.append({"role": "user", "content": _clean(obs, sb.workdir)})
    name = f"gen-s{seed}-t{turns}" + ("" if prompt == "agent" else f"-{prompt}")
    name += "" if repo is None else f"-{Path(repo).name}"
    name += "" if fact == "key" else f"-{fact}"
    return Episode(name=name, messages=messages, probe=probe, meta={"seed": seed, "turns": turns})


def _render(call: dict) -> str:
    import json

    return render_tool_call({"name": call["name"], "arguments": json.dumps(call["arguments"])})
