"""kvagent.cli: the `kvagent` command. `app.py` declares every command and its options; the body of
each command lives beside it (`solve.py`, `chat.py`, `eval.py`, ...). Only this layer loads engines,
opens sandboxes, prints and draws progress; the layers below take those as arguments. Importing the
package loads nothing more (no typer): benchmarks/ scripts read the option declarations
(`settings.py`) on machines that have no typer."""


def main() -> None:
    """The `kvagent` console command (`python -m kvagent`)."""
    from kvagent.cli.app import main as run

    run()


__all__ = ["main"]
