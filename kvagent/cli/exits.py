"""How a command fails: bad input (`KvagentError`) as one line and exit 2, a file that cannot be read
or written as one line and exit 1, Ctrl-C as exit 130, typer's own usage errors as one line; and
error messages' leading field spelled as the option the user typed. Not option code: the options'
declarations are settings.py's, their parsing kvagent/options.py's."""

from __future__ import annotations

import errno
import re
from collections.abc import Callable
from functools import wraps
from typing import Any

import typer


def fail(message: str, code: int = 2) -> None:
    """Print one line to stderr and exit non-zero."""
    typer.echo(f"kvagent: error: {cli_spelling(message)}", err=True)
    raise typer.Exit(code)


# A message's leading field as the layers below spell it (max_steps:, policy_args.kernel:). Run labels
# and instance ids hold a double underscore, so they never match.
_FIELD = re.compile(r"^([a-z]+(?:_[a-z]+)+)([.:])")


def cli_spelling(message: str) -> str:
    """The leading field of an error message spelled as the option the user typed (--max-steps)."""
    m = _FIELD.match(message)
    if not m:
        return message
    name = "policy-arg" if m.group(1) == "policy_args" else m.group(1).replace("_", "-")
    return name + (" " if m.group(2) == "." else ":") + message[m.end() :]


def user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn KvagentError (bad input, missing resource) into a one-line error and exit 2; a file that
    cannot be read or written (OSError) into one line and exit 1; Ctrl-C into exit 130."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from kvagent.errors import KvagentError

        try:
            return fn(*args, **kwargs)
        except KvagentError as e:
            fail(str(e))
        except KeyboardInterrupt:
            typer.echo("kvagent: interrupted", err=True)
            raise typer.Exit(130) from None
        except OSError as e:
            if e.errno == errno.EPIPE:  # stdout closed early (`| head`): typer exits quietly
                raise
            fail(os_error_line(e), code=1)

    return wrapper


# Typer ships its own copy of click; its exception classes are reached through a public one.
_CLICK_ERRORS = {c.__name__: c for c in typer.BadParameter.__mro__}


def run_app(app: typer.Typer, argv: list[str] | None = None) -> int:
    """Run `app` and return its exit code; a usage error (unknown option or command, a value of the
    wrong type, a missing argument) is one line naming it and where the help is, not typer's box."""
    try:
        code = app(args=argv, prog_name="kvagent", standalone_mode=False)
    except _CLICK_ERRORS["UsageError"] as e:
        where = e.ctx.command_path if e.ctx is not None else "kvagent"
        message = " ".join(e.format_message().split()).rstrip(".")
        if message:  # empty: a group called bare, which has just printed its help
            typer.echo(f"kvagent: error: {message}; see `{where} --help`", err=True)
        return e.exit_code
    except _CLICK_ERRORS["ClickException"] as e:
        typer.echo(f"kvagent: error: {' '.join(e.format_message().split())}", err=True)
        return e.exit_code
    except typer.Abort:  # Ctrl-C outside a command body (commands turn it into exit 130 themselves)
        typer.echo("kvagent: interrupted", err=True)
        return 130
    return code if isinstance(code, int) else 0


def os_error_line(e: OSError) -> str:
    """`File exists: out` (with both paths of a rename) and what to do about it."""
    paths = " -> ".join(str(p) for p in (e.filename, e.filename2) if p is not None)
    what = e.strerror or str(e) or type(e).__name__
    return f"{what}: {paths}; check the path and its permissions" if paths else f"{what} ({type(e).__name__})"
