"""kvagent.cli: the `kvagent` command. `app.py` declares every command and its options; the body of
each command lives beside it (`solve.py`, `chat.py`, `eval.py`, ...). Only this layer loads engines,
opens sandboxes, prints and draws progress; the layers below take those as arguments."""

from kvagent.cli.app import app, main

__all__ = ["app", "main"]
