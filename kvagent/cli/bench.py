"""`kvagent bench fidelity` and `kvagent bench speed`: parse the sweep, load the model, run the
benchmark with progress bars, print its table."""

from __future__ import annotations

from pathlib import Path

from kvagent.cli.common import load_engine
from kvagent.errors import ConfigError
from kvagent.options import parse_budgets, parse_policy_args, split_list


def local_sandbox(repo: Path):
    """How generated episodes run their tool calls: a local sandbox over a copy of `repo`."""
    from kvagent.sandbox import open_sandbox

    return open_sandbox("local", repo=repo)


def run_fidelity_bench(
    *, model, policies, modes, budgets, scopes, protect, episodes, out, buffer, window, seed, policy_arg,
    max_tokens, quiet, device="auto", dtype="auto",
) -> list[dict]:  # fmt: skip
    from kvagent.bench.fidelity import make_grid, run_fidelity
    from kvagent.bench.sources import load_episodes
    from kvagent.bench.stream import build_stream
    from kvagent.cli.ui import Bars

    if max_tokens is not None and max_tokens < 1:
        raise ConfigError(f"max-tokens: must be >= 1, got {max_tokens}")
    names = split_list(policies, "policies")
    grid = make_grid(
        names,
        split_list(modes, "modes"),
        split_list(scopes, "scopes"),
        parse_budgets(budgets),
        split_list(protect, "protect"),
        buffer=buffer,
        window=window,
        seed=seed,
        policy_args=parse_policy_args(policy_arg, names),
    )
    eps = load_episodes(list(episodes), open_env=local_sandbox)
    engine = load_engine(model, device=device, dtype=dtype)
    streams = [build_stream(e, engine.tokenizer, max_tokens=max_tokens) for e in eps]
    with Bars(enabled=not quiet) as bars:
        records = run_fidelity(engine, streams, grid, Path(out), model, progress=bars)
    print((Path(out) / "fidelity.md").read_text(encoding="utf-8"))
    print(f"wrote {Path(out) / 'fidelity.json'}, fidelity.md, fidelity.png")
    return records


def run_speed_bench(
    *, model, policies, lengths, budget, buffer, policy_arg, steps, episode, device, dtype, out, quiet
) -> dict:
    from kvagent.bench.sources import load_episodes
    from kvagent.bench.speed import run_speed, speed_config
    from kvagent.bench.stream import build_stream
    from kvagent.cli.ui import Bars
    from kvagent.runspec import sweep

    pols = split_list(policies, "policies")
    try:
        lens = sorted({int(x) for x in split_list(lengths, "lengths")})
    except ValueError:
        raise ConfigError(f"lengths: {lengths!r} must be comma-separated integers") from None
    if lens[0] < 1 or budget < 1 or buffer < 1 or steps < 1:
        raise ConfigError("lengths, budget, buffer and steps must be >= 1")
    if device not in ("auto", "cpu") and not device.startswith("cuda"):
        raise ConfigError(f"device: got {device!r}; use auto, cpu or cuda")
    args = parse_policy_args(policy_arg, pols)
    sweep(pols, ["persistent"], [budget], buffer=buffer, policy_args=args)  # names and options
    ep = load_episodes([episode], open_env=local_sandbox)[0]
    engine = load_engine(model, device=device, dtype=dtype)
    for p in pols:  # the budget suits each policy (its block) and the model (its context)
        engine.session(speed_config(p, budget, buffer, args.get(p)))
    stream = build_stream(ep, engine.tokenizer)
    with Bars(enabled=not quiet) as bars:
        result = run_speed(engine, model, pols, lens, budget, buffer, steps, stream, out, args, progress=bars)
    outp = Path(out)
    print((outp / "speed.md").read_text(encoding="utf-8"))
    print(f"wrote {outp / 'speed.json'}, speed.md, speed.png")
    return result
