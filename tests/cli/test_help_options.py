"""Every command lists the options it listed before the settings got one declaration each (issue
#47): the same spellings, value types and defaults, so every option a user types keeps working with
the same meaning. The committed list is help_options.json; a change that adds or renames an option
on purpose regenerates it with `python tests/cli/test_help_options.py --write` and shows in the diff."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer.main

from kvagent.cli.app import app

LISTED = Path(__file__).with_name("help_options.json")


def _commands(command, path):
    if hasattr(command, "commands"):
        for name, sub in sorted(command.commands.items()):
            yield from _commands(sub, [*path, name])
    else:
        yield " ".join(path), command


def options_now() -> dict[str, dict[str, str]]:
    """Per command, each parameter as its help shows it (`--budget <str>`; hidden ones marked)
    and its default."""
    root = typer.main.get_command(app)
    out = {}
    for name, command in _commands(root, []):
        ctx = type(root).context_class(command, info_name=name)
        params = {}
        for p in command.params:
            record = p.get_help_record(ctx)
            shown = record[0] if record else f"(hidden) {'/'.join(p.opts)}"
            params[shown] = repr(p.default)
        out[name] = params
    return out


def test_every_command_lists_the_options_it_listed_before():
    before = json.loads(LISTED.read_text(encoding="utf-8"))
    now = options_now()
    assert sorted(now) == sorted(before)
    for name in before:
        gone = {k: v for k, v in before[name].items() if now[name].get(k) != v}
        new = {k: v for k, v in now[name].items() if before[name].get(k) != v}
        assert not gone and not new, f"{name}: was {gone}, now {new}"


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    LISTED.write_text(json.dumps(options_now(), indent=1, sort_keys=True) + "\n", encoding="utf-8")
