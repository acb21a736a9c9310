"""`kvagent bench fidelity` and `kvagent bench speed`: parse the sweep, load the model, run the
benchmark with progress bars, print its table."""

from __future__ import annotations

from pathlib import Path

from kvagent.cli.common import check_out_dir, load_engine, resume_hint
from kvagent.cli.environments import local_sandbox
from kvagent.cli.settings import CacheOptions, EngineOptions
from kvagent.errors import ConfigError
from kvagent.options import parse_budgets, parse_policy_args, split_list


def _setting_value(name: str, text: str):
    """A comma list item as the CacheConfig field `name` takes it (numbers for numeric fields)."""
    from kvagent.runspec import DEFAULTS

    kind = type(DEFAULTS[name])
    try:
        return kind(text) if kind in (int, float) else text
    except ValueError:
        raise ConfigError(f"{name.replace('_', '-')}: {text!r} is not a number") from None


def _check_context(streams, limit: int | None, model: str) -> None:
    """A stream past the model's context would be compared where the model has never been trained
    (positions it cannot place): refused before any replay, naming the cut that fits."""
    for st in streams:
        if limit and len(st.ids) > limit:
            raise ConfigError(
                f"episodes: {st.name} is {len(st.ids):,} tokens, past {model}'s context of {limit:,}; "
                f"cut episodes at whole turns with --max-tokens {limit}"
            )


# bench fidelity's cache fields with one value, or a list of their own; the rest it takes are axes.
_ONE_OR_LISTED = ("buffer", "window", "seed", "protect")


def run_fidelity_bench(
    *, engine: EngineOptions, cache: CacheOptions, episodes, out, max_tokens, quiet, reuse_prefix=True,
    history="keep",
) -> list[dict]:  # fmt: skip
    """`cache`: the lists to sweep (policies, modes, budgets, scopes, protect), one buffer, window and
    seed, and each other cache field it takes as a comma list of values (`--head-budget
    uniform,adaptive`): each value runs for the policies that accept it."""
    from kvagent.bench.fidelity import make_grid, run_fidelity
    from kvagent.bench.sources import load_episodes
    from kvagent.bench.stream import build_stream
    from kvagent.cli.ui import Bars, print_markdown
    from kvagent.runspec import DEFAULTS

    if max_tokens is not None and max_tokens < 1:
        raise ConfigError(f"max-tokens: must be >= 1, got {max_tokens}")
    names = split_list(cache.policies, "policies")
    axes = {k: text for k, text in cache.fields().items() if k not in _ONE_OR_LISTED}
    swept = {
        k: [_setting_value(k, v) for v in split_list(text, k.replace("_", "-"))] for k, text in axes.items()
    }
    args = parse_policy_args(cache.policy_arg, names)
    grid = make_grid(
        names,
        split_list(cache.modes, "modes"),
        split_list(cache.scopes, "scopes"),
        parse_budgets(cache.budgets),
        split_list(cache.protect, "protect"),
        buffer=cache.buffer,
        window=cache.window,
        seed=cache.seed,
        policy_args=args,
        axes=swept,
    )
    from kvagent.bench.masking import with_histories

    grid = with_histories(grid, split_list(history, "history"))  # --history: observation masking too
    for name, values in swept.items():  # make_grid kept each value's runs for the policies taking it
        for value in values:
            took = list(
                dict.fromkeys(s.policy for s in grid if s.policy != "full" and getattr(s, name) == value)
            )
            others = [p for p in names if p != "full" and p not in took]
            if value != DEFAULTS[name] and others:
                print(f"{name.replace('_', '-')} {value}: run for {', '.join(took)}; not for {', '.join(others)} "
                      f"({DEFAULTS[name]} only)")  # fmt: skip
    check_out_dir(out)
    eps = load_episodes(list(episodes), open_env=local_sandbox)
    model = engine.model
    engine = load_engine(engine)
    streams = [build_stream(e, engine.tokenizer, max_tokens=max_tokens) for e in eps]
    _check_context(streams, engine.max_context, model)
    with resume_hint(out), Bars(enabled=not quiet) as bars:
        records = run_fidelity(
            engine, streams, grid, Path(out), model, progress=bars, reuse_prefix=reuse_prefix
        )
    print_markdown((Path(out) / "fidelity.md").read_text(encoding="utf-8"))
    print(f"wrote {Path(out) / 'fidelity.json'}, fidelity.md, fidelity.png")
    return records


def run_speed_bench(
    *, engine: EngineOptions, policies, lengths, budget, buffer, policy_arg, steps, episode, out, quiet,
    framework="recent-buffer",
) -> dict:  # fmt: skip
    from kvagent.bench.sources import load_episodes
    from kvagent.bench.speed.run import run_speed, speed_config
    from kvagent.bench.stream import build_stream
    from kvagent.cli.ui import Bars, print_markdown
    from kvagent.runspec import sweep

    pols = split_list(policies, "policies")
    try:
        lens = sorted({int(x) for x in split_list(lengths, "lengths")})
    except ValueError:
        raise ConfigError(f"lengths: {lengths!r} must be comma-separated integers") from None
    if lens[0] < 1 or budget < 1 or buffer < 1 or steps < 1:
        raise ConfigError("lengths, budget, buffer and steps must be >= 1")
    args = parse_policy_args(policy_arg, pols)
    sweep(pols, ["persistent"], [budget], buffer=buffer, framework=framework, policy_args=args)  # fmt: skip
    check_out_dir(out)
    ep = load_episodes([episode], open_env=local_sandbox)[0]
    model = engine.model
    engine = load_engine(engine)
    for p in pols:  # the budget suits each policy (its block) and the model (its context)
        engine.session(speed_config(p, budget, buffer, args.get(p), framework))
    stream = build_stream(ep, engine.tokenizer)
    with Bars(enabled=not quiet) as bars:
        result = run_speed(engine, model, pols, lens, budget, buffer, steps, stream, out, args, progress=bars,
                           framework=framework)  # fmt: skip
    outp = Path(out)
    print_markdown((outp / "speed.md").read_text(encoding="utf-8"))
    print(f"wrote {outp / 'speed.json'}, speed.md, speed.png")
    return result


def run_study_bench(
    *, claim, engine: EngineOptions, episodes, out, concurrency, estimate_only, report_only, quiet,
    reuse_prefix=True,
) -> dict | None:  # fmt: skip
    """Run (or resume) one claim's pre-registered design: the episodes it chooses, the power
    calculation and the estimated time first; then study.md / episodes.md / .json / PNGs."""
    import shlex

    from kvagent.bench.fidelity import load_records
    from kvagent.bench.sources import load_episodes
    from kvagent.bench.stream import build_stream
    from kvagent.bench.study import run as st
    from kvagent.bench.study.design import DESIGNS, select
    from kvagent.bench.study.plots import plot_study
    from kvagent.bench.study.report import power_summary, write_report
    from kvagent.bench.study.segments import DESIGNS as SEGMENT_DESIGNS
    from kvagent.bench.study.verdicts import analyse
    from kvagent.cli.ui import Bars, print_markdown

    if claim in SEGMENT_DESIGNS:  # the third claim's designs: their own runs and analysis (segments.py)
        from kvagent.cli.bench.segments import run_segments_bench

        if concurrency != 1:
            raise ConfigError(
                f"concurrency: the {claim} design runs one replay at a time; leave --concurrency out"
            )
        return run_segments_bench(engine=engine, episodes=episodes, out=out, quiet=quiet, report_only=report_only,
                                  claim=claim, estimate_only=estimate_only)  # fmt: skip
    claims = [*DESIGNS, *SEGMENT_DESIGNS]
    if claim is None:
        raise ConfigError(f"claim: none given; pass --claim {' or --claim '.join(claims)} (docs/study.md)")
    if claim not in DESIGNS:
        raise ConfigError(f"claim: got {claim!r}; choose one of {', '.join(claims)}")
    if concurrency < 1:
        raise ConfigError(f"concurrency: must be >= 1, got {concurrency}")
    design = DESIGNS[claim]
    model = engine.model
    out = out or f"study-{claim}"
    outp = check_out_dir(out)
    opts = [("claim", claim), ("model", model), *[("episodes", e) for e in episodes], ("out", out),
            ("concurrency", concurrency)]  # fmt: skip
    command = "kvagent bench study " + " ".join(f"--{k} {shlex.quote(str(v))}" for k, v in opts)
    st.check_resume(design, outp, model)
    if report_only:
        records = [r for r in load_records(outp) if r.get("model") == model]
        if not records:
            raise ConfigError(
                f"report-only: no results of model {model} in {outp / 'fidelity.json'}; run the study first"
            )
        chosen, not_chosen = st.load_selection(outp)
    else:
        eps = load_episodes(list(episodes), open_env=local_sandbox)
        eps = [st.prepare(design, e) for e in eps]
        engine = load_engine(engine, max_batch=concurrency)
        try:
            streams = [build_stream(e, engine.tokenizer, max_tokens=design.max_tokens) for e in eps]
            picked, rows = select(design, streams)
            print(power_summary(design, picked, rows), flush=True)
            if not picked:
                raise ConfigError(f"episodes: none of the {len(rows)} is eligible for the {claim} design "
                                  f"(e.g. {rows[0].name}: {rows[0].reason})")  # fmt: skip
            st.save_selection(outp, design, picked, rows)
            refs: dict = {}
            print(f"study: timing one full-cache replay of {picked[0].name} ...", flush=True)
            est = st.estimate(engine, picked, design, outp, model, refs, reuse_prefix=reuse_prefix)
            print(
                f"study: {len(picked)} episodes, {est.runs} runs ({est.done} done, {est.skipped} settings skipped), "
                f"~{est.tokens:,} tokens to replay at {est.seconds_per_token * 1000:.1f} ms/token: estimated "
                f"{est.seconds / 3600:.1f} h ({est.seconds / 60:.0f} min) one run at a time (the same command "
                f"started again on this --out runs beside it)",
                flush=True,
            )
            if estimate_only:
                return None
            with resume_hint(out), Bars(enabled=not quiet) as bars:
                records = st.run_study(engine, picked, design, outp, model, progress=bars, concurrency=concurrency,
                                       refs=refs, reuse_prefix=reuse_prefix)  # fmt: skip
        finally:
            engine.close()
        chosen = [s.name for s in picked]
        not_chosen = [{"name": e.name, "reason": e.reason or "eligible, past the planned count"}
                      for e in rows if e.name not in set(chosen)]  # fmt: skip
    result = analyse(records, design, chosen, not_chosen)
    plots = [p.name for p in plot_study(result, outp)]
    path = write_report(result, outp, command=command, plots=plots)
    print_markdown(path.read_text(encoding="utf-8"))
    print(f"wrote {path}, episodes.md, study.json, {', '.join(plots)} (raw runs: {outp / 'fidelity.json'})")
    return result
