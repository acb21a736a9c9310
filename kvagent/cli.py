"""The `kvagent` command line. Each command's body lives in the layer that owns it; this file only
parses options and turns user errors into one line and a non-zero exit."""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import wraps
from typing import Any

import typer

from kvagent.options import parse_budget, parse_budgets, split_list

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


def not_built(command: str) -> None:
    fail(f"`kvagent {command}` is not built yet in this version; see the project's open issues")


@app.command()
@user_errors
def demo(
    model: str = typer.Option(
        "smollm2", help="Model: smollm2 (bundled), tiny-random-qwen3, or an HF id / dir."
    ),
    out: str = typer.Option("demo-out", help="Directory for the results."),
    budget: int = typer.Option(512, help="K: entries per head kept at each eviction round (multiple of 32)."),
    turns: int = typer.Option(12, help="Tool calls in the generated episode."),
    seed: int = typer.Option(0, help="Episode seed (same seed, same token stream)."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bars."),
) -> None:
    """The main job on the bundled small model: compare eviction policies on a coding-agent episode."""
    from kvagent.bench.demo import run_demo

    run_demo(model=model, out=out, budget=budget, turns=turns, seed=seed, progress=not quiet)


DEFAULT_MODEL = "agentica-org/DeepSWE-Preview"


def parse_policy_args(items: list[str] | None) -> dict[str, Any]:
    """`key=value` pairs; values parsed as JSON when they can be (numbers, true/false), else strings."""
    import json

    from kvagent.errors import ConfigError

    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"policy-arg: {item!r} is not key=value; e.g. --policy-arg lam=0.5")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def make_cache_config(policy, budget, buffer, mode, scope, protect, window, seed, policy_arg):
    from kvagent.runtime import CacheConfig

    return CacheConfig(
        policy=policy,
        budget=parse_budget(budget),
        buffer=buffer,
        mode=mode,
        scope=scope,
        protect=protect,
        window=window,
        seed=seed,
        policy_args=parse_policy_args(policy_arg),
    )


def make_agent_config(max_steps, max_new_tokens, context_limit, temperature, prompt_style, seed):
    from kvagent.agent.config import AgentConfig

    return AgentConfig(
        max_steps=max_steps,
        max_new_tokens=max_new_tokens,
        context_limit=context_limit,
        temperature=temperature,
        prompt_style=prompt_style,
        seed=seed,
    )


def read_issue(issue: str) -> str:
    """--issue takes the text itself or a path to a file holding it."""
    import os
    from pathlib import Path

    from kvagent.errors import KvagentError

    if not issue.strip():
        raise KvagentError("issue: empty; pass the issue text or a file holding it")
    path = Path(issue).expanduser()
    looks_like_path = (
        "\n" not in issue and " " not in issue.strip() and (bool(path.suffix) or os.sep in issue)
    )
    if looks_like_path:
        if not path.is_file():
            raise KvagentError(f"issue: file {issue} does not exist; pass the issue text or an existing file")
        return path.read_text(encoding="utf-8", errors="replace")
    return issue


# Options shared by the commands that run the agent.
OPT_MODEL = typer.Option(
    DEFAULT_MODEL, help="smollm2 (bundled), tiny-random-qwen3, a hub id, a dir or .gguf."
)
OPT_POLICY = typer.Option(
    "full", help="Eviction policy: full, streaming, random, snapkv, h2o, pyramidkv, nexus."
)
OPT_BUDGET = typer.Option(None, help="K entries per head kept (int) or a fraction of the context (0.2).")
OPT_BUFFER = typer.Option(128, help="r: a round fires at K + r entries.")
OPT_MODE = typer.Option("persistent", help="persistent | reprefill.")
OPT_SCOPE = typer.Option("prefill+decode", help="prefill | prefill+decode.")
OPT_PROTECT = typer.Option("prompt", help="prompt | sink | none.")
OPT_WINDOW = typer.Option(16, help="W: recent queries used for scoring.")
OPT_SEED = typer.Option(0, help="Seeds eviction draws and sampling.")
OPT_POLICY_ARG = typer.Option(None, "--policy-arg", help="Policy knob key=value (repeatable), e.g. lam=0.5.")
OPT_DEVICE = typer.Option("auto", help="auto | cpu | cuda[:N].")
OPT_DTYPE = typer.Option("auto", help="auto | float32 | bfloat16 | float16.")


@app.command()
@user_errors
def solve(
    issue: str = typer.Option(..., help="The issue text, or a file holding it."),
    repo: str = typer.Option(None, help="Local repository to work on (copied; never edited in place)."),
    image: str = typer.Option(None, help="Docker image with the repository at /testbed."),
    model: str = OPT_MODEL,
    policy: str = OPT_POLICY,
    budget: str = OPT_BUDGET,
    buffer: int = OPT_BUFFER,
    mode: str = OPT_MODE,
    scope: str = OPT_SCOPE,
    protect: str = OPT_PROTECT,
    window: int = OPT_WINDOW,
    seed: int = OPT_SEED,
    policy_arg: list[str] = OPT_POLICY_ARG,
    max_steps: int = typer.Option(100, help="Hard limit on model calls."),
    max_new_tokens: int = typer.Option(8192, help="Tokens per reply."),
    context_limit: int = typer.Option(65_536, help="Logical tokens; the episode ends cleanly there."),
    temperature: float = typer.Option(1.0, help="Sampling temperature (0 = greedy)."),
    prompt_style: str = typer.Option(
        "repo_first", help="Instance prompt: repo_first (eval) or issue_first (training)."
    ),
    out: str = typer.Option(
        None, help="Directory for episode.traj.json and patch.diff (default runs/solve-TIME)."
    ),
    device: str = OPT_DEVICE,
    dtype: str = OPT_DTYPE,
) -> None:
    """Run the agent on one issue in a repository or image."""
    from kvagent.agent.runner import run_solve

    run_solve(
        issue_text=read_issue(issue),
        repo=repo,
        image=image,
        model=model,
        cache_config=make_cache_config(
            policy, budget, buffer, mode, scope, protect, window, seed, policy_arg
        ),
        agent_config=make_agent_config(
            max_steps, max_new_tokens, context_limit, temperature, prompt_style, seed
        ),
        out=out,
        device=device,
        dtype=dtype,
    )


def per_policy_args(items: list[str] | None) -> dict[str, dict[str, Any]]:
    """`nexus.lam=0.5` -> {"nexus": {"lam": 0.5}}."""
    from kvagent.errors import ConfigError

    out: dict[str, dict[str, Any]] = {}
    for item in items or []:
        policy, dot, rest = item.partition(".")
        if not dot:
            raise ConfigError(f"policy-arg: {item!r} needs POLICY.KEY=VALUE, e.g. nexus.lam=0.5")
        out.setdefault(policy, {}).update(parse_policy_args([rest]))
    return out


@app.command(name="eval")
@user_errors
def eval_(
    dataset: str = typer.Option(
        ..., help="SWE-bench instances: .json/.jsonl/.parquet file or HF dataset name."
    ),
    split: str = typer.Option("test", help="Dataset split (HF names, folders)."),
    instances: str = typer.Option(None, help="Selection: ids a,b | slice 0:10 | re:REGEX | repo:owner/name."),
    policies: str = typer.Option("full,random,nexus", help="Comma list of policies."),
    modes: str = typer.Option("persistent,reprefill", help="Comma list: persistent, reprefill."),
    budgets: str = typer.Option("1024", help="Comma list of budgets (tokens or fractions)."),
    seeds: str = typer.Option("0", help="Comma list of seeds (Pass@1 averages over them)."),
    model: str = OPT_MODEL,
    buffer: int = OPT_BUFFER,
    scope: str = OPT_SCOPE,
    protect: str = OPT_PROTECT,
    window: int = OPT_WINDOW,
    policy_arg: list[str] = typer.Option(None, "--policy-arg", help="POLICY.KEY=VALUE (repeatable)."),
    env: str = typer.Option("docker", help="docker (instance images) or local (--repos checkouts)."),
    repos: str = typer.Option(None, help="With --env local: DIR/<instance_id> checkouts at base commit."),
    grade: bool = typer.Option(True, help="Grade each run in a fresh sandbox."),
    workers: int = typer.Option(1, help="Episodes in parallel (one shared model)."),
    max_steps: int = typer.Option(100, help="Hard step limit per episode."),
    max_new_tokens: int = typer.Option(8192, help="Tokens per reply."),
    context_limit: int = typer.Option(65_536, help="Logical tokens per episode."),
    temperature: float = typer.Option(1.0, help="Sampling temperature."),
    out: str = typer.Option("runs/eval", help="Run directory (resumable)."),
    device: str = OPT_DEVICE,
    dtype: str = OPT_DTYPE,
) -> None:
    """Run the agent over SWE-bench instances for each policy x mode x budget x seed."""
    from kvagent.errors import ConfigError
    from kvagent.evals.batch import run_eval

    try:
        seed_list = [int(x) for x in split_list(seeds, "seeds")]
    except ValueError:
        raise ConfigError(f"seeds: {seeds!r} must be comma-separated integers") from None
    run_eval(
        dataset=dataset,
        split=split,
        instances=instances,
        policies=split_list(policies, "policies"),
        modes=split_list(modes, "modes"),
        budgets=parse_budgets(budgets),
        seeds=seed_list,
        model=model,
        cache_options={"buffer": buffer, "scope": scope, "protect": protect, "window": window},
        policy_args=per_policy_args(policy_arg),
        agent_config=make_agent_config(
            max_steps, max_new_tokens, context_limit, temperature, "repo_first", 0
        ),
        env=env,
        repos=repos,
        grade=grade,
        workers=workers,
        out=out,
        device=device,
        dtype=dtype,
    )


@app.command()
@user_errors
def chat(
    repo: str = typer.Option(..., help="Local repository to work on (copied; never edited in place)."),
    model: str = OPT_MODEL,
    policy: str = OPT_POLICY,
    budget: str = OPT_BUDGET,
    buffer: int = OPT_BUFFER,
    mode: str = OPT_MODE,
    scope: str = OPT_SCOPE,
    protect: str = OPT_PROTECT,
    window: int = OPT_WINDOW,
    seed: int = OPT_SEED,
    policy_arg: list[str] = OPT_POLICY_ARG,
    approval: str = typer.Option(
        "confirm", help="confirm: a key (y/n/q) before each tool call; yolo: run all."
    ),
    max_steps: int = typer.Option(100, help="Hard limit on model calls per request."),
    max_new_tokens: int = typer.Option(8192, help="Tokens per reply."),
    context_limit: int = typer.Option(65_536, help="Logical tokens of the whole chat."),
    temperature: float = typer.Option(1.0, help="Sampling temperature (0 = greedy)."),
    prompt_style: str = typer.Option("repo_first", help="First request's prompt: repo_first or issue_first."),
    device: str = OPT_DEVICE,
    dtype: str = OPT_DTYPE,
) -> None:
    """Interactive agent over a local repository with a bounded cache."""
    from kvagent.agent.chat import run_chat

    run_chat(
        repo=repo,
        model=model,
        cache_config=make_cache_config(
            policy, budget, buffer, mode, scope, protect, window, seed, policy_arg
        ),
        agent_config=make_agent_config(
            max_steps, max_new_tokens, context_limit, temperature, prompt_style, seed
        ),
        approval=approval,
        device=device,
        dtype=dtype,
    )


@app.command()
@user_errors
def grade(
    predictions: str = typer.Argument(..., help="Predictions JSONL/JSON in SWE-bench format, or `gold`."),
    dataset: str = typer.Option(..., help="The instances' dataset file or HF name."),
    split: str = typer.Option("test", help="Dataset split."),
    instances: str = typer.Option(None, help="Only these instances (same selection syntax as eval)."),
    out: str = typer.Option("grade-out", help="Directory for report.json and logs."),
    timeout: int = typer.Option(1800, help="Seconds per instance's tests."),
    harness: str = typer.Option("kvagent", help="kvagent (offline images) or official (swebench harness)."),
) -> None:
    """Grade a predictions file against its SWE-bench instances."""
    from kvagent.errors import ConfigError
    from kvagent.evals.grading import grade_predictions

    if harness == "official":
        from kvagent.errors import KvagentError
        from kvagent.evals.grading import run_official_harness

        rc = run_official_harness(predictions, dataset, instances, out, split=split, timeout=timeout)
        if rc:
            raise KvagentError(f"the swebench harness exited with {rc}; its logs are under {out}")
        return
    if harness != "kvagent":
        raise ConfigError(f"harness: got {harness!r}; choose kvagent or official")
    report_ = grade_predictions(
        predictions, dataset, instances, out, split=split, timeout=timeout, log=typer.echo
    )
    typer.echo(f"resolved {report_['resolved_instances']} of {report_['total_instances']}; {out}/report.json")


@app.command()
@user_errors
def report(run_dir: str = typer.Argument(..., help="A `kvagent eval` run directory.")) -> None:
    """Resolved / Pass@1 tables, CIs and plots for a run directory."""
    from pathlib import Path

    from kvagent.evals.report import write_report

    write_report(run_dir)
    typer.echo((Path(run_dir) / "report.md").read_text(encoding="utf-8"))


@images_app.command("base")
@user_errors
def images_base(
    tag: str = typer.Option("kvagent/base:bookworm", help="Image tag."),
    force: bool = typer.Option(False, help="Rebuild even if the tag exists."),
    suite: str = typer.Option("bookworm", help="Debian suite for debootstrap."),
) -> None:
    """Build the registry-free base image (debootstrap + docker import)."""
    from kvagent.sandbox.images import build_base_image

    typer.echo(build_base_image(tag=tag, force=force, suite=suite))


@images_app.command("build")
@user_errors
def images_build(
    instances: str = typer.Option(..., help="Instance ids (comma list) or a selection (re:..., 0:3)."),
    dataset: str = typer.Option(
        None, help="Dataset holding the instances (default: the shipped recipes' ids)."
    ),
    split: str = typer.Option("test", help="Dataset split."),
    recipes: list[str] = typer.Option(None, "--recipes", help="Extra recipe files (JSON/YAML)."),
    rebuild: bool = typer.Option(False, help="Rebuild existing images."),
) -> None:
    """Build runnable SWE-bench instance images offline (base rootfs + sdist + pinned wheels)."""
    from kvagent.evals.images import build_images, load_recipes

    recipe_map = load_recipes(recipes or ())
    if dataset:
        from kvagent.evals.datasets import load_instances

        targets: list[Any] = load_instances(dataset, split=split, select=instances)
    else:
        targets = split_list(instances, "instances")
    for tag in build_images(targets, recipes=recipe_map, rebuild=rebuild, log=typer.echo):
        typer.echo(tag)


@bench_app.command("fidelity")
@user_errors
def bench_fidelity(
    model: str = typer.Option("smollm2", help="smollm2, tiny-random-qwen3 (smoke), or an HF id / dir."),
    policies: str = typer.Option(
        "random,snapkv,h2o,streaming,pyramidkv,nexus", help="Comma list of policies."
    ),
    modes: str = typer.Option("persistent,reprefill", help="Comma list: persistent, reprefill."),
    budgets: str = typer.Option("1536,2048", help="Comma list of K (tokens, or fractions in (0,1))."),
    scopes: str = typer.Option("prefill+decode", help="Comma list: prefill, prefill+decode."),
    protect: str = typer.Option("prompt", help="Comma list: prompt, sink, none."),
    episodes: list[str] = typer.Option(  # noqa: B006
        ["gen:seed=0,turns=16"],
        help="Episode source (repeatable): gen[:seed=N,turns=T,repo=DIR], "
        "FILE.jsonl[:first=N,ids=a|b,max_chars=C], FILE.traj.json, or a directory of *.traj.json.",
    ),
    out: str = typer.Option("bench-out", help="Directory for fidelity.json / .md / .png (resumable)."),
    buffer: int = typer.Option(128, help="r: a round fires at K + r entries."),
    window: int = typer.Option(16, help="W: recent queries kept for scoring."),
    seed: int = typer.Option(0, help="Session seed (random draws of the policies)."),
    max_tokens: int = typer.Option(None, help="Cut each episode to at most this many tokens (whole turns)."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bars."),
) -> None:
    """Replay agent episodes under each policy and compare with the full cache."""
    from kvagent.bench.cli_support import fidelity_command

    fidelity_command(
        model,
        policies,
        modes,
        budgets,
        scopes,
        protect,
        episodes,
        out,
        buffer,
        window,
        seed,
        max_tokens,
        quiet,
    )


@bench_app.command("speed")
@user_errors
def bench_speed(
    model: str = typer.Option("smollm2", help="smollm2, tiny-random-qwen3 (smoke), or an HF id / dir."),
    policies: str = typer.Option("full,random,streaming,snapkv,h2o,pyramidkv,nexus", help="Comma list."),
    lengths: str = typer.Option("1024,4096,8192", help="Comma list of logical lengths for decode latency."),
    budget: int = typer.Option(1024, help="K for the evicting policies (multiple of 32 for nexus)."),
    buffer: int = typer.Option(128, help="r: a round fires at K + r entries."),
    steps: int = typer.Option(256, help="Decode steps timed at each length (>= r, so rounds are included)."),
    episode: str = typer.Option("gen:seed=0,turns=32", help="Episode spec for persistent vs reprefill cost."),
    device: str = typer.Option("auto", help="auto, cpu or cuda."),
    out: str = typer.Option("bench-out", help="Directory for speed.json / .md / .png."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bars."),
) -> None:
    """Decode latency, eviction-round cost and KV memory per policy."""
    from kvagent.bench.speed import speed_command

    speed_command(
        model=model,
        policies=policies,
        lengths=lengths,
        budget=budget,
        buffer=buffer,
        steps=steps,
        episode=episode,
        device=device,
        out=out,
        quiet=quiet,
    )


def main() -> None:
    app(prog_name="kvagent")


if __name__ == "__main__":
    sys.exit(main())
