"""Glue between `kvagent bench ...` options and the benchmark modules (keeps cli.py thin)."""

from __future__ import annotations

from pathlib import Path

from kvagent.errors import ConfigError


def load_engine(model: str, device: str = "auto"):
    import torch

    from kvagent.runtime import Engine

    if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
        # Benchmarks on a shared CPU: more threads than cores only adds contention.
        import os

        torch.set_num_threads(max(1, min(torch.get_num_threads(), os.cpu_count() or 1)))
    return Engine.load(model, device=device)


def fidelity_command(
    model, policies, modes, budgets, scopes, protect, episodes, out, buffer, window, seed, max_tokens, quiet
) -> list[dict]:
    from kvagent.bench.episodes import load_episodes
    from kvagent.bench.fidelity import make_grid, run_fidelity
    from kvagent.bench.stream import build_stream
    from kvagent.options import parse_budgets, split_list

    if max_tokens is not None and max_tokens < 1:
        raise ConfigError(f"max-tokens: must be >= 1, got {max_tokens}")
    grid = make_grid(
        split_list(policies, "policies"),
        split_list(modes, "modes"),
        split_list(scopes, "scopes"),
        parse_budgets(budgets),
        split_list(protect, "protect"),
        buffer=buffer,
        window=window,
        seed=seed,
    )
    eps = load_episodes(list(episodes))
    engine = load_engine(model)
    streams = [build_stream(e, engine.tokenizer, max_tokens=max_tokens) for e in eps]
    records = run_fidelity(engine, streams, grid, Path(out), model, show_progress=not quiet)
    print((Path(out) / "fidelity.md").read_text(encoding="utf-8"))
    print(f"wrote {Path(out) / 'fidelity.json'}, fidelity.md, fidelity.png")
    return records
