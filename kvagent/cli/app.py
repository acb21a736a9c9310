"""The `kvagent` command line: every command's options, declared once here and shared (model, cache,
agent and sweep options), and a one-line error with exit 2 for bad input. Each body lives in the
module of the same name beside this one."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Annotated, Any

import typer

app = typer.Typer(
    name="kvagent",
    help="Coding agents over one live, evictable KV cache: solve, evaluate and benchmark eviction policies.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
images_app = typer.Typer(help="Build sandbox images without any registry.", no_args_is_help=True)
bench_app = typer.Typer(help="Fidelity and speed benchmarks of eviction policies.", no_args_is_help=True)
app.add_typer(images_app, name="images")
app.add_typer(bench_app, name="bench")

AGENT_MODEL = "agentica-org/DeepSWE-Preview"
BENCH_MODEL = "smollm2"


def fail(message: str, code: int = 2) -> None:
    """Print one line to stderr and exit non-zero."""
    typer.echo(f"kvagent: error: {message}", err=True)
    raise typer.Exit(code)


def user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn KvagentError (bad input, missing resource) into a one-line error and exit 2."""

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

    return wrapper


# ----------------------------------------------------------------------------- the shared options
# model
Model = Annotated[str, typer.Option(help="smollm2 (bundled), tiny-random-qwen3, a hub id, a dir or .gguf.")]
Device = Annotated[str, typer.Option(help="auto | cpu | cuda[:N].")]
Dtype = Annotated[str, typer.Option(help="auto | float32 | bfloat16 | float16.")]
# cache, one run
Policy = Annotated[str, typer.Option(help="Eviction policy: full, random, snapkv, nexus, ... (a wrong name lists them all).")]
Budget = Annotated[
    str | None, typer.Option(help="K entries per head kept (int) or a fraction of the context (0.2).")
]
Mode = Annotated[str, typer.Option(help="persistent | reprefill.")]
Scope = Annotated[str, typer.Option(help="prefill | prefill+decode.")]
Protect = Annotated[str, typer.Option(help="prompt | sink | none.")]
Seed = Annotated[int, typer.Option(help="Seeds eviction draws and sampling.")]
# cache, every command
Buffer = Annotated[int, typer.Option(help="r: a round fires at K + r entries.")]
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
# agent
MaxSteps = Annotated[int, typer.Option(help="Hard limit on model calls (per request in chat).")]
MaxNewTokens = Annotated[int, typer.Option(help="Tokens per reply.")]
ContextLimit = Annotated[int, typer.Option(help="Logical tokens; the episode ends cleanly there.")]
Temperature = Annotated[float, typer.Option(help="Sampling temperature (0 = greedy).")]
PromptStyle = Annotated[
    str, typer.Option(help="Instance prompt: repo_first (eval) or issue_first (training).")
]
Split = Annotated[str, typer.Option(help="Dataset split (HF names, folders).")]
Instances = Annotated[
    str | None, typer.Option(help="Selection: ids a,b | slice 0:10 | re:REGEX | repo:owner/name.")
]


def cache_args(policy, budget, buffer, mode, scope, protect, window, seed, policy_arg) -> dict[str, Any]:
    return dict(
        policy=policy, budget=budget, buffer=buffer, mode=mode, scope=scope, protect=protect,
        window=window, seed=seed, policy_arg=policy_arg,
    )  # fmt: skip


def agent_args(max_steps, max_new_tokens, context_limit, temperature, prompt_style, seed) -> dict[str, Any]:
    return dict(
        max_steps=max_steps, max_new_tokens=max_new_tokens, context_limit=context_limit,
        temperature=temperature, prompt_style=prompt_style, seed=seed,
    )  # fmt: skip


# ----------------------------------------------------------------------------- commands
@app.command()
@user_errors
def demo(
    model: Model = BENCH_MODEL,
    out: Annotated[str, typer.Option(help="Directory for the results.")] = "demo-out",
    budget: Annotated[int, typer.Option(help="K: entries per head kept at each eviction round.")] = 512,
    turns: Annotated[int, typer.Option(help="Tool calls in the generated episode.")] = 12,
    seed: Annotated[int, typer.Option(help="Episode seed (same seed, same token stream).")] = 0,
    quiet: Quiet = False,
    device: Device = "auto",
    dtype: Dtype = "auto",
) -> None:
    """The main job on the bundled small model: compare eviction policies on a coding-agent episode."""
    from kvagent.cli.demo import run_demo

    run_demo(model=model, out=out, budget=budget, turns=turns, seed=seed, progress=not quiet,
             device=device, dtype=dtype)  # fmt: skip


@app.command()
@user_errors
def solve(
    issue: Annotated[str, typer.Option(help="The issue text, or a file holding it.")],
    repo: Annotated[
        str | None, typer.Option(help="Local repository (copied; never edited in place).")
    ] = None,
    image: Annotated[str | None, typer.Option(help="Docker image with the repository at /testbed.")] = None,
    model: Model = AGENT_MODEL,
    policy: Policy = "full",
    budget: Budget = None,
    buffer: Buffer = 128,
    mode: Mode = "persistent",
    scope: Scope = "prefill+decode",
    protect: Protect = "prompt",
    window: Window = 16,
    seed: Seed = 0,
    policy_arg: PolicyArg = None,
    max_steps: MaxSteps = 100,
    max_new_tokens: MaxNewTokens = 8192,
    context_limit: ContextLimit = 65_536,
    temperature: Temperature = 1.0,
    prompt_style: PromptStyle = "repo_first",
    out: Annotated[
        str | None,
        typer.Option(help="Directory for episode.traj.json and patch.diff (default runs/solve-TIME)."),
    ] = None,
    device: Device = "auto",
    dtype: Dtype = "auto",
) -> None:
    """Run the agent on one issue in a repository or image."""
    from kvagent.cli.solve import run_solve

    run_solve(
        issue=issue, repo=repo, image=image, model=model, out=out, device=device, dtype=dtype,
        cache=cache_args(policy, budget, buffer, mode, scope, protect, window, seed, policy_arg),
        agent=agent_args(max_steps, max_new_tokens, context_limit, temperature, prompt_style, seed),
    )  # fmt: skip


@app.command()
@user_errors
def chat(
    repo: Annotated[str, typer.Option(help="Local repository (copied; never edited in place).")],
    model: Model = AGENT_MODEL,
    policy: Policy = "full",
    budget: Budget = None,
    buffer: Buffer = 128,
    mode: Mode = "persistent",
    scope: Scope = "prefill+decode",
    protect: Protect = "prompt",
    window: Window = 16,
    seed: Seed = 0,
    policy_arg: PolicyArg = None,
    approval: Annotated[
        str, typer.Option(help="confirm: a key (y/n/q) before each tool call; yolo: run all.")
    ] = "confirm",
    max_steps: MaxSteps = 100,
    max_new_tokens: MaxNewTokens = 8192,
    context_limit: ContextLimit = 65_536,
    temperature: Temperature = 1.0,
    prompt_style: PromptStyle = "repo_first",
    device: Device = "auto",
    dtype: Dtype = "auto",
) -> None:
    """Interactive agent over a local repository with a bounded cache."""
    from kvagent.cli.chat import run_chat

    run_chat(
        repo=repo, model=model, approval=approval, device=device, dtype=dtype,
        cache=cache_args(policy, budget, buffer, mode, scope, protect, window, seed, policy_arg),
        agent=agent_args(max_steps, max_new_tokens, context_limit, temperature, prompt_style, seed),
    )  # fmt: skip


@app.command(name="eval")
@user_errors
def eval_(
    dataset: Annotated[str, typer.Option(help="SWE-bench instances: .json/.jsonl/.parquet file or HF name.")],
    split: Split = "test",
    instances: Instances = None,
    policies: Policies = "full,random,nexus",
    modes: Modes = "persistent,reprefill",
    budgets: Budgets = "1024",
    seeds: Annotated[str, typer.Option(help="Comma list of seeds (Pass@1 averages over them).")] = "0",
    model: Model = AGENT_MODEL,
    buffer: Buffer = 128,
    scope: Scope = "prefill+decode",
    protect: Protect = "prompt",
    window: Window = 16,
    policy_arg: PolicyArg = None,
    env: Annotated[
        str, typer.Option(help="docker (instance images) or local (--repos checkouts).")
    ] = "docker",
    repos: Annotated[
        str | None, typer.Option(help="With --env local: DIR/<instance_id> checkouts at base commit.")
    ] = None,
    grade: Annotated[bool, typer.Option(help="Grade each run in a fresh sandbox.")] = True,
    workers: Annotated[int, typer.Option(help="Episodes in parallel (one shared model).")] = 1,
    max_steps: MaxSteps = 100,
    max_new_tokens: MaxNewTokens = 8192,
    context_limit: ContextLimit = 65_536,
    temperature: Temperature = 1.0,
    out: Annotated[str, typer.Option(help="Run directory (resumable).")] = "runs/eval",
    device: Device = "auto",
    dtype: Dtype = "auto",
) -> None:
    """Run the agent over SWE-bench instances for each policy x mode x budget x seed."""
    from kvagent.cli.eval import run_eval

    run_eval(
        dataset=dataset, split=split, instances=instances, policies=policies, modes=modes,
        budgets=budgets, seeds=seeds, model=model, policy_arg=policy_arg, env=env, repos=repos,
        grade=grade, workers=workers, out=out, device=device, dtype=dtype,
        cache_options={"buffer": buffer, "scope": scope, "protect": protect, "window": window},
        agent=agent_args(max_steps, max_new_tokens, context_limit, temperature, "repo_first", 0),
    )  # fmt: skip


@app.command()
@user_errors
def grade(
    predictions: Annotated[
        str, typer.Argument(help="Predictions JSONL/JSON in SWE-bench format, or `gold`.")
    ],
    dataset: Annotated[str, typer.Option(help="The instances' dataset file or HF name.")],
    split: Split = "test",
    instances: Instances = None,
    out: Annotated[str, typer.Option(help="Directory for report.json and logs.")] = "grade-out",
    timeout: Annotated[int, typer.Option(help="Seconds per instance's tests.")] = 1800,
    harness: Annotated[
        str, typer.Option(help="kvagent (offline images) or official (swebench harness).")
    ] = "kvagent",
) -> None:
    """Grade a predictions file against its SWE-bench instances."""
    from kvagent.cli.grade import run_grade

    run_grade(
        predictions, dataset, split=split, instances=instances, out=out, timeout=timeout, harness=harness
    )


@app.command()
@user_errors
def report(run_dir: Annotated[str, typer.Argument(help="A `kvagent eval` run directory.")]) -> None:
    """Resolved / Pass@1 tables, CIs and plots for a run directory."""
    from kvagent.cli.report import run_report

    run_report(run_dir)


@images_app.command("base")
@user_errors
def images_base(
    tag: Annotated[str, typer.Option(help="Image tag.")] = "kvagent/base:bookworm",
    force: Annotated[bool, typer.Option(help="Rebuild even if the tag exists.")] = False,
    suite: Annotated[str, typer.Option(help="Debian suite for debootstrap.")] = "bookworm",
) -> None:
    """Build the registry-free base image (debootstrap + docker import)."""
    from kvagent.cli.images import run_images_base

    run_images_base(tag=tag, force=force, suite=suite)


@images_app.command("build")
@user_errors
def images_build(
    instances: Annotated[str, typer.Option(help="Instance ids (comma list) or a selection (re:..., 0:3).")],
    dataset: Annotated[
        str | None, typer.Option(help="Dataset holding the instances (default: the shipped recipes' ids).")
    ] = None,
    split: Split = "test",
    recipes: Annotated[list[str] | None, typer.Option("--recipes", help="Extra recipe files (JSON).")] = None,
    rebuild: Annotated[bool, typer.Option(help="Rebuild existing images.")] = False,
) -> None:
    """Build runnable SWE-bench instance images offline (base rootfs + sdist + pinned wheels)."""
    from kvagent.cli.images import run_images_build

    run_images_build(instances=instances, dataset=dataset, split=split, recipes=recipes, rebuild=rebuild)


@images_app.command("check")
@user_errors
def images_check(
    instances: Annotated[str, typer.Option(help="Instance ids (comma list) or a selection (re:..., 0:3).")],
    dataset: Annotated[str, typer.Option(help="Dataset holding the instances.")],
    split: Split = "test",
    recipes: Annotated[list[str] | None, typer.Option("--recipes", help="Extra recipe files (JSON).")] = None,
    rebuild: Annotated[bool, typer.Option(help="Rebuild existing images.")] = False,
    out: Annotated[str, typer.Option(help="Directory for check.json and the grading logs.")] = "check-out",
    timeout: Annotated[int, typer.Option(help="Seconds per test run.")] = 1800,
) -> None:
    """Is each recipe good? Builds, FAIL_TO_PASS fail before gold, empty patch fails, gold resolves."""
    from kvagent.cli.images_check import run_images_check

    run_images_check(instances=instances, dataset=dataset, split=split, recipes=recipes, rebuild=rebuild,
                     out=out, timeout=timeout)  # fmt: skip


@bench_app.command("fidelity")
@user_errors
def bench_fidelity(
    model: Model = BENCH_MODEL,
    policies: Policies = "random,snapkv,h2o,streaming,pyramidkv,nexus",
    modes: Modes = "persistent,reprefill",
    budgets: Budgets = "1536,2048",
    scopes: Annotated[str, typer.Option(help="Comma list: prefill, prefill+decode.")] = "prefill+decode",
    protect: Annotated[str, typer.Option(help="Comma list: prompt, sink, none.")] = "prompt",
    episodes: Annotated[
        list[str],
        typer.Option(
            help="Episode source (repeatable): gen[:seed=N,turns=T,repo=DIR], "
            "FILE.jsonl[:first=N,ids=a|b,max_chars=C], FILE.traj.json, or a directory of *.traj.json."
        ),
    ] = ["gen:seed=0,turns=16"],  # noqa: B006
    out: Annotated[
        str, typer.Option(help="Directory for fidelity.json / .md / .png (resumable).")
    ] = "bench-out",
    buffer: Buffer = 128,
    window: Window = 16,
    seed: Annotated[int, typer.Option(help="Session seed (random draws of the policies).")] = 0,
    policy_arg: PolicyArg = None,
    max_tokens: Annotated[
        int | None, typer.Option(help="Cut each episode to at most this many tokens (whole turns).")
    ] = None,
    quiet: Quiet = False,
    device: Device = "auto",
    dtype: Dtype = "auto",
) -> None:
    """Replay agent episodes under each policy and compare with the full cache."""
    from kvagent.cli.bench import run_fidelity_bench

    run_fidelity_bench(
        model=model, policies=policies, modes=modes, budgets=budgets, scopes=scopes, protect=protect,
        episodes=episodes, out=out, buffer=buffer, window=window, seed=seed, policy_arg=policy_arg,
        max_tokens=max_tokens, quiet=quiet, device=device, dtype=dtype,
    )  # fmt: skip


@bench_app.command("speed")
@user_errors
def bench_speed(
    model: Model = BENCH_MODEL,
    policies: Policies = "full,random,streaming,snapkv,h2o,pyramidkv,nexus",
    lengths: Annotated[
        str, typer.Option(help="Comma list of logical lengths for decode latency.")
    ] = "1024,4096,8192",
    budget: Annotated[
        int, typer.Option(help="K for the evicting policies (a multiple of their block).")
    ] = 1024,
    buffer: Buffer = 128,
    policy_arg: PolicyArg = None,
    steps: Annotated[
        int, typer.Option(help="Decode steps timed at each length (>= r, so rounds are included).")
    ] = 256,
    episode: Annotated[
        str, typer.Option(help="Episode spec for persistent vs reprefill cost.")
    ] = "gen:seed=0,turns=32",
    device: Device = "auto",
    dtype: Dtype = "auto",
    out: Annotated[str, typer.Option(help="Directory for speed.json / .md / .png.")] = "bench-out",
    quiet: Quiet = False,
) -> None:
    """Decode latency, eviction-round cost and KV memory per policy."""
    from kvagent.cli.bench import run_speed_bench

    run_speed_bench(
        model=model, policies=policies, lengths=lengths, budget=budget, buffer=buffer,
        policy_arg=policy_arg, steps=steps, episode=episode, device=device, dtype=dtype, out=out,
        quiet=quiet,
    )  # fmt: skip


def main() -> None:
    app(prog_name="kvagent")
