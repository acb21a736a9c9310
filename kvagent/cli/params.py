"""The options every command shares (model, cache, agent and sweep options, one `--policy-arg`
syntax), declared once as typer types, and the one-line error handling of every command."""

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
# model
Model = Annotated[str, typer.Option(help="smollm2 (bundled), tiny-random-qwen3, a hub id, a dir or .gguf.")]
Device = Annotated[str, typer.Option(help="auto | cpu | cuda[:N].")]
Dtype = Annotated[str, typer.Option(help="auto | float32 | bfloat16 | float16.")]
# cache, one run
Policy = Annotated[
    str, typer.Option(help="Eviction policy: full, random, snapkv, nexus, ... (a wrong name lists them all).")
]
Budget = Annotated[
    str | None,
    typer.Option(
        help="K: entries per KV head kept at each round (int), or a fraction of the tokens so far (0.2); "
        "every policy but full needs one. Default: none (the full cache)."
    ),
]
Mode = Annotated[str, typer.Option(help="persistent | reprefill.")]
Scope = Annotated[str, typer.Option(help="prefill | prefill+decode.")]
Protect = Annotated[str, typer.Option(help="prompt | sink | none.")]
HeadBudget = Annotated[
    str, typer.Option(help="uniform (K per head) | adaptive (Ada-KV: a layer's K x H_kv split by score).")
]
Seed = Annotated[int, typer.Option(help="Seeds eviction draws and sampling.")]
# cache, every command
Buffer = Annotated[
    int, typer.Option(help="r: a round every r tokens (at K + 2r entries; K + r under topk-all).")
]
Framework = Annotated[
    str,
    typer.Option(
        help="recent-buffer (the papers': the newest r entries are never scored, K + r kept) | topk-all "
        "(kvagent's before: the top K of all entries, each policy with its own recency keep)."
    ),
]
Cadence = Annotated[
    str,
    typer.Option(
        help="layer (each layer's round at its own trigger) | shared (once a layer is due, every layer over "
        "K + r cuts too: one round per r tokens where layers keep different K, as pyramidkv's)."
    ),
]
Window = Annotated[int, typer.Option(help="W: recent queries used for scoring.")]
PolicyArg = Annotated[
    list[str] | None,
    typer.Option(
        "--policy-arg",
        help="Policy option [POLICY.]KEY=VALUE (repeatable): lam=0.5 with one policy, nexus.lam=0.5 with several.",
    ),
]
# sweeps
Policies = Annotated[str, typer.Option(help="Comma list of policies.")]
Modes = Annotated[str, typer.Option(help="Comma list: persistent, reprefill.")]
Budgets = Annotated[str, typer.Option(help="Comma list of budgets (tokens, or fractions in (0,1)).")]
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
# agent
MaxSteps = Annotated[int, typer.Option(help="Hard limit on model calls (per request in chat).")]
MaxNewTokens = Annotated[
    int | None, typer.Option(help="Tokens per reply (default 8192; no cap under --scaffold r2egym).")
]
ContextLimit = Annotated[int, typer.Option(help="Logical tokens; the episode ends cleanly there.")]
Temperature = Annotated[float, typer.Option(help="Sampling temperature (0 = greedy).")]
PromptStyle = Annotated[
    str, typer.Option(help="Instance prompt: repo_first (eval) or issue_first (training).")
]
Prompts = Annotated[
    str | None,
    typer.Option(
        help="YAML: system_prompt, instance_prompt ({problem_statement}); e.g. R2E-Gym's. Default: the "
        "scaffold's own."
    ),
]
Scaffold = Annotated[
    str, typer.Option(help="Protocol: kvagent, or r2egym (R2E-Gym's evaluation; docs/deepswe.md).")
]
History = Annotated[
    str | None,
    typer.Option(
        help="keep-thinking; drop-thinking (past replies' <think> leave the cache); r2egym (each past reply "
        "as R2E-Gym re-renders it: its call). Default: the scaffold's (r2egym under --scaffold r2egym)."
    ),
]
R2EGym = Annotated[
    str | None,
    typer.Option(
        "--r2egym",
        help="Your checkout of R2E-Gym: its prompt file and the strings its code hard-codes (with --scaffold "
        "r2egym; docs/deepswe.md).",
    ),
]
PatchRule = Annotated[
    str | None,
    typer.Option(
        help="Graded patch: full (the whole diff) or r2egym (R2E-Gym's: .py files edited with str_replace). "
        "Default: the scaffold's; both are recorded."
    ),
]
TopP = Annotated[
    float | None, typer.Option(help="Nucleus sampling. Default: the model's generation_config.json, else 1.")
]
TopK = Annotated[
    int | None, typer.Option(help="Top-k sampling (0 = off). Default: the model's generation_config.json.")
]
Network = Annotated[
    str, typer.Option(help="Docker sandboxes: none, or default (Docker's network, as R2E-Gym's containers).")
]
Split = Annotated[str, typer.Option(help="Dataset split (HF names, folders).")]
Instances = Annotated[
    str | None,
    typer.Option(help="Selection: ids a,b | slice 0:10 | re:REGEX | repo:owner/name. Default: all."),
]


def cache_args(params: Mapping[str, Any]) -> dict[str, Any]:
    """A command's cache settings out of all its parameters (`ctx.params`): those named as a run's
    CacheConfig fields (policy, budget, ..., as the command has them), so a field added there and
    declared as an option here reaches the command without another edit. --policy-arg is apart."""
    from kvagent.runspec import IDENTITY

    return {k: v for k, v in params.items() if k in IDENTITY}


# A command's agent options and the AgentConfig fields they set.
AGENT_OPTIONS = {
    "max_steps": "max_steps", "max_new_tokens": "max_new_tokens", "context_limit": "context_limit",
    "temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "prompt_style": "prompt_style",
    "seed": "seed", "prompts": "prompts", "r2egym": "r2egym_path", "scaffold": "scaffold",
    "history": "history", "patch_rule": "patch_rule",
}  # fmt: skip
LEFT_TO_SCAFFOLD = ("max_new_tokens", "history", "patch_rule")  # None: the scaffold's value


def agent_args(params: Mapping[str, Any], **fixed: Any) -> dict[str, Any]:
    """The AgentConfig options out of a command's parameters (`ctx.params`) and `fixed` (values a
    command does not take as options, e.g. eval's prompt_style). An option left out (None) is the
    scaffold's (per-reply cap, history, patch rule) or, for top_p / top_k, the model's
    generation_config.json."""
    from kvagent.agent.config import BY_SCAFFOLD

    given = {**{k: v for k, v in params.items() if k in AGENT_OPTIONS}, **fixed}
    out = {AGENT_OPTIONS[k]: v for k, v in given.items()}
    return {**out, **{k: BY_SCAFFOLD for k in LEFT_TO_SCAFFOLD if out.get(k) is None}}


# Local sandboxes: how model-written commands run.
Isolation = Annotated[
    str,
    typer.Option(
        help="Local sandboxes: bwrap (bubblewrap; refuses to start without it) or none (the model's "
        "commands run on this host, unisolated). Docker containers are always isolated."
    ),
]
