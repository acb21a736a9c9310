"""`kvagent demo` / `make demo`: one generated coding-agent episode replayed on the bundled SmolLM2
under full / random / snapkv / nexus, persistent and reprefill, at one tight budget. A 135M model
cannot solve issues; the demo shows what eviction does to its next-token distributions and to a
fact stated once early in the episode."""

from __future__ import annotations

import time
from pathlib import Path

DEMO_POLICIES = ("random", "snapkv", "nexus")


def run_demo(
    model: str = "smollm2",
    out: str = "demo-out",
    budget: int = 512,
    turns: int = 12,
    seed: int = 0,
    progress: bool = True,
    policies=DEMO_POLICIES,
    device: str = "auto",
    dtype: str = "auto",
) -> list[dict]:
    from kvagent.bench.fidelity import make_grid, run_fidelity
    from kvagent.bench.generator import MIN_TURNS, generate_episode
    from kvagent.bench.stream import build_stream
    from kvagent.cli.common import check_out_dir, load_engine, resume_hint
    from kvagent.cli.ui import Bars
    from kvagent.errors import ConfigError
    from kvagent.runtime.budget import prompt_fit_problem, roomy_budget

    if budget < 1:
        raise ConfigError(f"budget: must be >= 1 token, got {budget}; e.g. --budget 512")
    if turns < MIN_TURNS:
        raise ConfigError(
            f"turns: {turns} is too short for the generated episode; use --turns {MIN_TURNS} or more"
        )
    check_out_dir(out)
    grid = make_grid(list(policies), ["persistent", "reprefill"], ["prefill+decode"], [budget], ["prompt"])
    t0 = time.perf_counter()
    print(
        f"kvagent demo: generating a {turns}-call episode (seed {seed}, compact system prompt) in a local sandbox ...",
        flush=True,
    )
    episode = generate_episode(seed=seed, turns=turns, prompt="compact", open_env=_demo_sandbox)
    print(f"loading {model} ...", flush=True)
    engine = load_engine(model, device=device, dtype=dtype)
    stream = build_stream(episode, engine.tokenizer)
    for spec in grid:  # the budget suits each policy (its block) and holds the protected prompt
        config = spec.cache_config()
        engine.session(config)
        if prompt_fit_problem(config, stream.prompt_length, engine.n_layers):  # the demo has no --protect
            raise ConfigError(
                f"budget: K={budget} cannot hold the episode's protected prompt ({stream.prompt_length} "
                f"tokens), so nothing could be evicted; use --budget {roomy_budget(stream.prompt_length)} or more"
            )
    print(
        f"episode {stream.name}: {len(stream.ids)} tokens, {stream.n_turns} assistant turns "
        f"({stream.n_scored} scored tokens), prompt {stream.prompt_length}; budget K={budget}, r=128",
        flush=True,
    )
    with resume_hint(out), Bars(enabled=progress) as bars:
        records = run_fidelity(engine, [stream], grid, Path(out), model, progress=bars)
    _print_table(records)
    print(
        f"\nwrote {out}/fidelity.json, {out}/fidelity.md and {out}/fidelity.png "
        f"in {time.perf_counter() - t0:.0f} s",
        flush=True,
    )
    return records


def _demo_sandbox(repo: Path):
    """The generated episode's calls are the demo's own (scripted), so they run in the best sandbox
    the machine allows rather than being refused where bubblewrap is missing; one line says which."""
    from kvagent.cli.environments import sandbox_line, scripted_sandbox

    sb = scripted_sandbox(repo)
    print(sandbox_line(sb, "the demo's"), flush=True)
    return sb


def _print_table(records: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    from kvagent.bench.tables import fidelity_rows

    t = Table(title="Fidelity vs the full cache (teacher-forced assistant tokens)")
    for col in (
        "policy",
        "mode",
        "K",
        "mean KL",
        "top-1 agree",
        "log p(true)",
        "fact retrieved",
        "log p(fact)",
        "rounds",
        "KV MiB",
    ):
        t.add_column(col, justify="left" if col in ("policy", "mode") else "right")
    for r in fidelity_rows(records):
        full = r["policy"] == "full"
        t.add_row(
            r["policy"],
            "-" if full else r["mode"],
            "dense" if r["budget"] is None else str(r["budget"]),
            f"{r['kl']:.4f}",
            f"{r['top1']:.1%}",
            f"{r['logp_true']:.3f}",
            "-" if r["retrieval"] is None else ("yes" if r["retrieval"] >= 1 else "no"),
            "-" if r["probe_logp"] is None else f"{r['probe_logp']:.2f}",
            f"{r['rounds']:.0f}",
            f"{r['kv_mib']:.1f}",
        )
    Console(width=120).print(t)
