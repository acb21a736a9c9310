"""`kvagent bench fidelity|study|speed|serve|episodes`: declarations of the benchmark commands (bodies:
run.py, segments.py, serve.py, episodes.py)."""

from __future__ import annotations

from typing import Annotated

import typer

from kvagent.cli.exits import user_errors
from kvagent.cli.settings import (
    BENCH_MODEL,
    FROM_OPTIONS,
    CacheOptions,
    EngineOptions,
    Quiet,
    ReusePrefix,
    cache_options,
    engine_options,
)

bench_app = typer.Typer(
    help="Benchmarks of eviction policies: fidelity to the full cache, the policy study, speed and memory.",
    no_args_is_help=True,
)


@bench_app.command("fidelity")
@user_errors
@cache_options(
    ["buffer", "window", "seed", "policy_args"],
    many=["policy", "mode", "budget", "scope", "protect", "head_budget", "framework", "cadence"],
    policies="random,snapkv,h2o,streaming,pyramidkv,nexus", modes="persistent,reprefill", budgets="1536,2048",
    scopes="prefill+decode",
)  # fmt: skip
@engine_options(model=BENCH_MODEL)
def bench_fidelity(
    engine: EngineOptions = FROM_OPTIONS,
    cache: CacheOptions = FROM_OPTIONS,
    episodes: Annotated[
        list[str],
        typer.Option(
            help="Episode source (repeatable): gen[:seed=N,turns=T,repo=DIR], "
            "FILE.jsonl[:first=N,ids=a|b,max_chars=C], FILE.traj.json, or a directory of *.traj.json."
        ),
    ] = ["gen:seed=0,turns=16"],  # noqa: B006
    out: Annotated[
        str,
        typer.Option(
            help="Directory for fidelity.json / .md / .png (resumable; several processes may share it)."
        ),
    ] = "bench-out",
    max_tokens: Annotated[
        int | None,
        typer.Option(
            help="Cut each episode to at most this many tokens (whole turns). Default: whole episodes."
        ),
    ] = None,
    history: Annotated[
        str,
        typer.Option(
            help="Comma list of histories to replay each setting under: keep (as recorded), "
            "mask-observations[=M] (the newest M tool outputs whole, older ones forgotten or, in "
            "reprefill, re-sent as one placeholder line; M=10 as The Complexity Trap)."
        ),
    ] = "keep",
    quiet: Quiet = False,
    reuse_prefix: ReusePrefix = True,
) -> None:
    """Replay agent episodes under each policy and compare with the full cache."""
    from kvagent.cli.bench.run import run_fidelity_bench

    run_fidelity_bench(
        engine=engine, cache=cache, episodes=episodes, out=out, max_tokens=max_tokens, quiet=quiet,
        reuse_prefix=reuse_prefix, history=history,
    )  # fmt: skip


@bench_app.command("study")
@user_errors
@engine_options(model=BENCH_MODEL)
def bench_study(
    # Required, but checked in the body: a missing --claim is then the one-line error every other
    # bad option gives (typer's own "Missing option" is a box under CliRunner).
    claim: Annotated[
        str | None,
        typer.Option(
            help="The pre-registered design to run (docs/study.md), required: random (Random Attention), "
            "nexus (Nexus Sampling), segments (observation masking vs token-level eviction at equal KV) "
            "or segments-replication (the same on held-out episodes, the segments policy an arm too)."
        ),
    ] = None,
    engine: EngineOptions = FROM_OPTIONS,
    episodes: Annotated[
        list[str],
        typer.Option(
            help="Trajectories the design chooses its episodes from (repeatable), as for `bench fidelity`: "
            "FILE.jsonl[:first=N,ids=a|b], ... Default: the bundled ones (`kvagent bench episodes build`)."
        ),
    ] = ["bundled"],  # noqa: B006
    out: Annotated[
        str | None,
        typer.Option(
            help="Directory for fidelity.json (resumable), study.md / episodes.md / .json, PNGs. "
            "Default: study-CLAIM. Several processes may share it (on a CPU, one per core): each runs "
            "the next run no other holds."
        ),
    ] = None,  # fmt: skip
    concurrency: Annotated[
        int,
        typer.Option(
            help="Runs at once over one engine, forwards batched (max_batch); > 1 skips the fact probe."
        ),
    ] = 1,
    workers: Annotated[
        int | None, typer.Option(hidden=True, help="Deprecated name of --concurrency.")
    ] = None,
    estimate_only: Annotated[
        bool, typer.Option("--estimate-only", help="Print the power calculation and the estimate, and stop.")
    ] = False,
    report_only: Annotated[
        bool, typer.Option("--report-only", help="Rebuild the report from --out's results; run nothing.")
    ] = False,
    quiet: Quiet = False,
    reuse_prefix: ReusePrefix = True,
) -> None:
    """The study: one seed paper's claim under its own conditions, a design fixed in advance (episodes,
    budgets, framework, arms, margin, tests, Holm), with CIs and a verdict (see docs/study.md)."""
    from kvagent.cli.bench.run import run_study_bench

    if workers is not None:  # the name `eval` calls --concurrency
        typer.echo("kvagent: --workers is deprecated; use --concurrency", err=True)
        concurrency = workers
    run_study_bench(
        claim=claim, engine=engine, episodes=episodes, out=out, concurrency=concurrency,
        estimate_only=estimate_only, report_only=report_only, quiet=quiet, reuse_prefix=reuse_prefix,
    )  # fmt: skip


@bench_app.command("speed")
@user_errors
@cache_options(
    ["buffer", "framework", "policy_args"], many=["policy"], tokens=["budget"],
    policies="full,random,streaming,snapkv,h2o,pyramidkv,nexus", budget=1024,
)  # fmt: skip
@engine_options(model=BENCH_MODEL)
def bench_speed(
    engine: EngineOptions = FROM_OPTIONS,
    cache: CacheOptions = FROM_OPTIONS,
    lengths: Annotated[
        str, typer.Option(help="Comma list of logical lengths for decode latency.")
    ] = "1024,4096,8192",
    steps: Annotated[
        int, typer.Option(help="Decode steps timed at each length (>= r, so rounds are included).")
    ] = 256,
    episode: Annotated[
        str, typer.Option(help="Episode source, as for `bench fidelity`, for persistent vs reprefill cost.")
    ] = "gen:seed=0,turns=32",
    out: Annotated[str, typer.Option(help="Directory for speed.json / .md / .png.")] = "bench-out",
    quiet: Quiet = False,
) -> None:
    """Decode latency, eviction-round cost and KV memory per policy."""
    from kvagent.cli.bench.run import run_speed_bench

    run_speed_bench(
        engine=engine, policies=cache.policies, lengths=lengths, budget=cache.budget, buffer=cache.buffer,
        policy_arg=cache.policy_arg, steps=steps, episode=episode, out=out, quiet=quiet, framework=cache.framework,
    )  # fmt: skip


@bench_app.command("serve")
@user_errors
def bench_serve(
    url: Annotated[
        list[str],
        typer.Option(
            help="An OpenAI-compatible server's root, URL or LABEL=URL (repeatable: servers are measured one "
            "after another on the same workload)."
        ),
    ] = [],  # noqa: B006
    episodes: Annotated[
        list[str],
        typer.Option(
            help="Episode source (repeatable), as for `bench fidelity`: FILE.jsonl[:first=N,ids=a|b], ..."
        ),
    ] = ["bundled:plant=0"],  # noqa: B006
    concurrency: Annotated[int, typer.Option(help="Conversations in flight at once.")] = 8,
    conversations: Annotated[
        int | None, typer.Option(help="Conversations in all (each episode once). Default: --concurrency.")
    ] = None,
    turns: Annotated[int, typer.Option(help="Turns per conversation at most.")] = 8,
    max_context: Annotated[
        int, typer.Option(help="A conversation ends before the turn whose prompt + reply would pass this.")
    ] = 4096,
    max_reply: Annotated[int, typer.Option(help="Replies asked for at most this many tokens.")] = 256,
    clip_chars: Annotated[
        int | None,
        typer.Option(help="Cut each message longer than this many characters to its head and tail."),
    ] = 2000,
    tokenizer: Annotated[
        str, typer.Option(help="The served model's tokenizer (smollm2, a model directory): reply lengths.")
    ] = BENCH_MODEL,
    model_name: Annotated[
        str | None, typer.Option(help="The model name requests send. Default: the first /v1/models lists.")
    ] = None,
    temperature: Annotated[float, typer.Option(help="Sampling temperature (0: greedy).")] = 0.0,
    seed: Annotated[int, typer.Option(help="Each request's seed.")] = 0,
    timeout: Annotated[float, typer.Option(help="Seconds one request may take.")] = 600.0,
    out: Annotated[str, typer.Option(help="Directory for serve.json / .md / .png.")] = "bench-out",
    fresh: Annotated[
        bool,
        typer.Option(
            help="Open each conversation with this run's own tag, so no server reuses an earlier run's "
            "cached prefixes (--no-fresh: replay the recorded text exactly)."
        ),
    ] = True,
    quiet: Quiet = False,
) -> None:
    """Replay agent trajectories as concurrent multi-turn conversations against OpenAI-compatible
    servers (kvagent serve, vLLM): output tokens/s, TTFT, prompt tokens continued, KV memory."""
    from kvagent.cli.bench.serve import run_serve_bench

    run_serve_bench(
        urls=url, episodes=episodes, concurrency=concurrency, conversations=conversations, turns=turns,
        max_context=max_context, max_reply=max_reply, clip_chars=clip_chars, tokenizer=tokenizer,
        model_name=model_name, temperature=temperature, seed=seed, timeout=timeout, out=out, quiet=quiet,
        fresh=fresh,
    )  # fmt: skip


episodes_app = typer.Typer(
    help="The study's bundled trajectories, built from their public sources (a manifest of sha256s).",
    no_args_is_help=True,
)
bench_app.add_typer(episodes_app, name="episodes")


@episodes_app.command("build")
@user_errors
def episodes_build(
    source: Annotated[
        str | None,
        typer.Option(
            "--from",
            help="A local mirror: DIR/OWNER/NAME/PATH (a checkout at the manifest's commit, or the files; "
            "PATH.gz too) or DIR/OWNER/NAME a git repository with the commit. Default: download from GitHub.",
        ),
    ] = None,
    out: Annotated[
        str | None,
        typer.Option(
            help="Where to write the file. Default: the kvagent cache, where --episodes bundled reads."
        ),
    ] = None,
    ids: Annotated[
        list[str] | None,
        typer.Option(help="Build only these episodes (comma list or repeated; needs --out)."),
    ] = None,
    manifest: Annotated[
        str | None, typer.Option(help="The episode manifest. Default: the one kvagent ships.")
    ] = None,
) -> None:
    """Build the study's episode file from its sources, every record's sha256 checked.

    A record whose sha256 differs from the manifest's is refused in one line (the record, expected,
    got, the fix) and nothing is written."""
    from kvagent.cli.bench.episodes import run_build

    run_build(source=source, out=out, ids=ids, manifest=manifest)


@episodes_app.command("check")
@user_errors
def episodes_check(
    file: Annotated[
        str | None, typer.Argument(help="An episode file. Default: the built one in the kvagent cache.")
    ] = None,
    manifest: Annotated[
        str | None, typer.Option(help="The episode manifest. Default: the one kvagent ships.")
    ] = None,
) -> None:
    """Check an existing episode file against the manifest, record by record (sha256)."""
    from kvagent.cli.bench.episodes import run_check

    run_check(file=file, manifest=manifest)
