"""`kvagent demo` / `make demo`: one generated coding-agent episode replayed on the bundled SmolLM2
under full / random / snapkv / nexus, persistent and reprefill, at one tight budget. A 135M model
cannot solve issues; the demo shows what eviction does to its next-token distributions and to a
fact stated once early in the episode."""

from __future__ import annotations

import time
from pathlib import Path

from kvagent.cli.settings import EngineOptions

DEMO_POLICIES = ("random", "snapkv", "nexus")
# One more row: observation masking (the full cache, the newest M tool outputs whole, older ones
# forgotten), persistent; M=4 so that 8 of the episode's 12 tool outputs leave (the paper's 10: 2).
DEMO_HISTORY = "mask-observations=4"
PICTURE = "demo.png"


def run_demo(
    engine: EngineOptions,
    out: str = "demo-out",
    budget: int = 512,
    turns: int = 12,
    seed: int = 0,
    progress: bool = True,
    policies=DEMO_POLICIES,
) -> list[dict]:
    """`engine`: the engine options (model, device, ...)."""
    from kvagent.bench.demo.plot import plot_demo, probe_shown
    from kvagent.bench.demo.series import series
    from kvagent.bench.fidelity import make_grid, run_fidelity
    from kvagent.bench.generator import MIN_TURNS, generate_episode
    from kvagent.bench.masking import HistorySpec
    from kvagent.bench.stream import build_stream
    from kvagent.cli.common import check_out_dir, load_engine, resume_hint
    from kvagent.cli.ui import Bars
    from kvagent.errors import ConfigError
    from kvagent.runtime.budget import check_run, roomy_budget
    from kvagent.runtime.config import budget_value

    budget_value(budget)  # the one budget check, before the model loads
    if turns < MIN_TURNS:
        raise ConfigError(
            f"turns: {turns} is too short for the generated episode; use --turns {MIN_TURNS} or more"
        )
    check_out_dir(out)
    grid = make_grid(list(policies), ["persistent", "reprefill"], ["prefill+decode"], [budget], ["prompt"])
    grid.append(HistorySpec("full", history=DEMO_HISTORY))
    t0 = time.perf_counter()
    print(
        f"kvagent demo: generating a {turns}-call episode (seed {seed}, compact system prompt) in a local sandbox ...",
        flush=True,
    )
    episode = generate_episode(seed=seed, turns=turns, prompt="compact", open_env=_demo_sandbox, fact="port")
    model = engine.model
    print(f"loading {model} ...", flush=True)
    engine = load_engine(engine)
    stream = build_stream(episode, engine.tokenizer)
    for spec in grid:  # the budget suits each policy (its block) and holds the protected prompt
        if check_run(engine, spec.cache_config(), stream.prompt_length):  # the demo has no --protect
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
        records = run_fidelity(
            engine, [stream], grid, Path(out), model, progress=bars, plot=False, annotate=series
        )
    title = (
        f"{model} on {stream.name}: {len(stream.ids)} tokens, {stream.n_turns} assistant turns, "
        f"K={budget}, r={grid[-1].buffer}, {framework_text(records)}"
    )
    _print_table(records, title, engine.n_layers)
    plot_demo([r for r in records if not r.get("history")], Path(out) / PICTURE, title)
    print(
        f"\nwrote {out}/fidelity.json, {out}/fidelity.md and {out}/{PICTURE} "
        f"in {time.perf_counter() - t0:.0f} s",
        flush=True,
    )
    if not probe_shown(records):
        print("(no planted-fact column: the full cache does not retrieve the fact on this model)")
    return records


def framework_text(records: list[dict]) -> str:
    """How the evicting runs chose what stays (one framework for the whole demo: the default)."""
    names = sorted({r.get("framework", "topk-all") for r in records if r["policy"] != "full"})
    why = {"recent-buffer": "the newest r never scored", "topk-all": "top K of every entry"}
    return ", ".join(f"framework {n} ({why[n]})" if n in why else f"framework {n}" for n in names)


def _demo_sandbox(repo: Path):
    """The generated episode's calls are the demo's own (scripted), so they run in the best sandbox
    the machine allows rather than being refused where bubblewrap is missing; one line says which."""
    from kvagent.cli.environments import sandbox_line, scripted_sandbox

    sb = scripted_sandbox(repo)
    print(sandbox_line(sb, "the demo's"), flush=True)
    return sb


def _print_table(records: list[dict], title: str, n_layers: int) -> None:
    from rich.console import Console
    from rich.table import Table

    from kvagent.bench.demo.plot import probe_shown
    from kvagent.bench.fidelity.tables import fidelity_rows

    probe = probe_shown(records)
    cols = ["policy", "mode", "K", "mean KL", "top-1 agree", "log p(true)"]
    cols += ["fact retrieved", "log p(fact)"] if probe else []
    cols += ["rounds", "KV MiB"]
    t = Table(title=f"{title}\nFidelity vs the full cache (teacher-forced assistant tokens)",
              caption=_rounds_caption(records, n_layers), caption_justify="left")  # fmt: skip
    for col in cols:
        t.add_column(col, justify="left" if col in ("policy", "mode") else "right")
    for r in fidelity_rows(records):
        full = r["policy"] == "full"
        row = [
            r["policy"].split("+")[0],  # the demo varies policy and mode only; the title names the rest
            "masked M=4" if DEMO_HISTORY in r["policy"] else "-" if full else r["mode"],  # full, masked
            "dense" if r["budget"] is None else str(r["budget"]),
            f"{r['kl']:.4f}",
            f"{r['top1']:.1%}",
            f"{r['logp_true']:.3f}",
        ]
        if probe:
            row += [
                "-" if r["retrieval"] is None else ("yes" if r["retrieval"] >= 1 else "no"),
                "-" if r["probe_logp"] is None else f"{r['probe_logp']:.2f}",
            ]
        row += [f"{r['rounds']:.0f}", f"{r['kv_mib']:.1f}"]
        t.add_row(*row)
    Console(width=120).print(t)


def _rounds_caption(records: list[dict], n_layers: int) -> str:
    """Why the block policy's round count differs: a round is every layer that is due at once."""
    from kvagent.bench.demo.plot import band_text
    from kvagent.bench.demo.series import memory_band
    from kvagent.runspec import RunSpec
    from kvagent.runtime.config import build_policy

    due = next(
        (band_text(r["budget"], r["buffer"], b[1]) for r in records if (b := memory_band(r))), "its cap"
    )
    text = f"rounds: eviction events; each evicts every layer that has reached {due} at that moment."
    # The policy as the run built it (build_policy: its args and the run's window), for its block.
    blocks = sorted({(r["policy"], build_policy(RunSpec.from_record(r).cache_config()).block)
                     for r in records if r["policy"] != "full"})  # fmt: skip
    for name, block in blocks:
        if block > 1:
            text += (
                f"\n{name} keeps whole {block}-entry blocks, so a round can leave a layer up to {block - 1} entries "
                f"short of what it keeps (the block cut at the protected prompt's end), some of the {n_layers} layers "
                f"short and others not; the layers then reach {due} at different times and most of its rounds "
                "evict a few layers only: more, smaller rounds, not more rounds per layer."
            )
    return text
