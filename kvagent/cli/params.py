"""The options several commands share besides the engine, cache and agent settings (those are
`settings.py`'s): progress, sandbox and dataset options, declared once as typer types; the default
models; and the one-line error handling of every command."""

from __future__ import annotations

import errno
import re
from collections.abc import Callable, Mapping
from functools import wraps
from typing import Annotated, Any

import typer

AGENT_MODEL = "agentica-org/DeepSWE-Preview"  # solve, chat, eval
BENCH_MODEL = "smollm2"  # demo, bench: the bundled small model


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


# ----------------------------------------------------------------------------- the shared options
# The engine, cache and agent options: settings.py (one declaration per field).
Quiet = Annotated[bool, typer.Option("--quiet", help="No progress bars.")]
ReusePrefix = Annotated[
    bool,
    typer.Option(
        "--reuse-prefix/--no-reuse-prefix",
        help="Reprefill runs: each rebuild starts from the previous one's dense state at its last whole "
        "chunk (the same logits, a few times fewer forwards). Off: less memory (no copy of the dense "
        "history), and wall times that are the protocol's.",
    ),
]
Network = Annotated[
    str | None,
    typer.Option(
        help="Docker sandboxes: none, or default (Docker's network, as R2E-Gym's containers). Default: the "
        "scaffold's (default under --scaffold r2egym, none under kvagent's)."
    ),
]
Split = Annotated[str, typer.Option(help="Dataset split (HF names, folders).")]
Instances = Annotated[
    str | None,
    typer.Option(help="Selection: ids a,b | slice 0:10 | re:REGEX | repo:owner/name. Default: all."),
]


def cache_args(values: Mapping[str, Any]) -> dict[str, Any]:
    """Of option values by name (a test's, a script's), those named as a run's CacheConfig fields,
    as `options.cache_config` takes them. Commands get theirs typed (`settings.CacheOptions`)."""
    from kvagent.runspec import IDENTITY

    return {k: v for k, v in values.items() if k in IDENTITY}


def agent_args(values: Mapping[str, Any], **fixed: Any) -> dict[str, Any]:
    """The AgentConfig arguments of agent option values by name (a test's, a script's) and `fixed`
    (values not taken as options); `settings.AgentOptions.arguments` says how."""
    from dataclasses import fields

    from kvagent.cli.settings import AgentOptions

    names = {f.name for f in fields(AgentOptions)} - {"taken"}
    picked = {k: v for k, v in values.items() if k in names}
    return AgentOptions(**picked, taken=tuple(picked)).fixed(**fixed).arguments()


# Local sandboxes: how model-written commands run.
Isolation = Annotated[
    str,
    typer.Option(
        help="Local sandboxes: bwrap (bubblewrap; refuses to start without it) or none (the model's "
        "commands run on this host, unisolated). Docker containers are always isolated."
    ),
]
