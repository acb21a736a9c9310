"""kvagent.cli: the `kvagent` command. `app.py` assembles every command; a command's options, body
and output live together (a family of commands in its own sub-package: `bench/`, `eval/`, ...).
Only this layer loads engines, opens sandboxes, prints and draws progress; the layers below take
those as arguments. Importing the package loads nothing more (no typer): benchmarks/ scripts read
the option declarations (`settings.py`) on machines that have no typer."""


def main() -> None:
    """The `kvagent` console command (`python -m kvagent`)."""
    from kvagent.cli.app import main as run

    run()


__all__ = ["main"]
