"""`kvagent bench fidelity`: every episode under every run spec (policy x mode x scope x budget x
protect), compared token by token with the full-cache run; resumable results in `fidelity.json`."""

from __future__ import annotations

import itertools
import statistics
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kvagent.bench import replay as rp
from kvagent.bench.fidelity.shared_results import SharedResults, read_records
from kvagent.bench.fidelity.tables import fidelity_markdown
from kvagent.bench.masking import history_of, masker_for
from kvagent.bench.progress import NoProgress
from kvagent.bench.reference_cache import fill_references
from kvagent.bench.stream import Stream
from kvagent.errors import ConfigError
from kvagent.fileio import atomic_write_text
from kvagent.runspec import DEFAULTS, RunSpec, sweep
from kvagent.runtime.budget import check_run

RESULTS = "fidelity.json"


def make_grid(policies, modes, scopes, budgets, protects, buffer: int = 128, window: int = 16, seed: int = 0,
              policy_args=None, axes: Mapping[str, Sequence] | None = None) -> list[RunSpec]:  # fmt: skip
    """Specs to run; `full` once (it never evicts, so mode, scope, protect and budget do not apply).
    `axes`: other cache settings to sweep, each a list of values (`bench fidelity --head-budget
    uniform,adaptive`); a value other than the setting's default runs only for the policies that
    accept it (the others' runs would fail), and one that no policy accepts fails with the reason."""
    if buffer < 1:
        raise ConfigError(f"buffer: must be >= 1, got {buffer}")
    axes = dict(axes or {})
    specs: list[RunSpec] = []
    for combo in itertools.product(*axes.values()):
        setting = dict(zip(axes, combo, strict=True))
        plain = all(DEFAULTS[k] == v for k, v in setting.items())
        accepted, refused = [], []
        for p in policies:
            try:
                sweep([p], modes, budgets, [seed], scopes=scopes, protects=protects, policy_args=policy_args,
                      buffer=buffer, window=window, **setting)  # fmt: skip
                accepted.append(p)
            except ConfigError as e:
                if plain:
                    raise
                refused.append(str(e))
        if not plain and all(p == "full" for p in accepted):
            name, value = next((k, v) for k, v in setting.items() if DEFAULTS[k] != v)
            raise ConfigError(
                refused[0] if refused else f"{name}: {value} applies to evicting policies only; none is given"
            )
        specs += sweep(accepted, modes, budgets, [seed], scopes=scopes, protects=protects,
                       policy_args=policy_args, buffer=buffer, window=window, **setting)  # fmt: skip
    return [RunSpec("full", buffer=buffer, window=window, seed=seed)] + list(
        dict.fromkeys(s for s in specs if s.policy != "full")
    )


def check_setting(engine, spec: RunSpec, stream: Stream) -> str | None:
    """Why this spec cannot run on this episode (None if it can)."""
    if spec.policy == "full":
        return None
    try:
        return check_run(engine, spec.cache_config(), stream.prompt_length, option="--budgets")
    except ConfigError as e:
        raise ConfigError(f"{spec.label}: {e}") from None


# ----------------------------------------------------------------------- records
def record_key(rec: dict) -> tuple:
    """What makes two records results of the same run: episode, model, spec (a field an older record
    lacks has the value it ran with) and the policy's layer schedule (a record without one ran the
    uniform split: a pyramidkv record from before its paper schedule is not today's run)."""
    spec = RunSpec.from_record(rec)
    key = rec.get("episode"), rec.get("digest"), rec.get("model"), spec, rec.get("schedule", "uniform")
    # a replay under observation masking (bench/masking.py) is another run; records without it ran none
    return (*key, rec["history"]) if rec.get("history") else key


def schedule_of(spec: RunSpec) -> str:
    """How the spec's policy splits K over depth (BasePolicy.schedule), as records note it."""
    from kvagent.runtime.policies import make_policy

    return make_policy(spec.policy, **spec.policy_args).schedule


def run_key(stream: Stream, spec: RunSpec, model_name: str) -> tuple:
    """`record_key` of the record that running `spec` on `stream` will write."""
    here = {"episode": stream.name, "digest": stream.digest(), "model": model_name}
    return record_key({**spec.record(), **here, "schedule": schedule_of(spec)})


def load_records(out_dir: Path) -> list[dict]:
    return read_records(Path(out_dir) / RESULTS)


def summarise(spec: RunSpec, stream: Stream, model: str, res: rp.ReplayResult, ref_lp: float) -> dict:

    n = len(res.kl)
    mean = (lambda xs: sum(xs) / len(xs)) if n else (lambda xs: float("nan"))
    st = res.stats
    return {
        **spec.record(),
        "status": "ok",
        "episode": stream.name,
        "digest": stream.digest(),
        "model": model,
        # How the policy split K over depth (records without it predate the field; pyramidkv's
        # then was kvagent's own floor-16 split with the window inside each layer's share).
        "schedule": schedule_of(spec),
        "n_scored": n,
        "tokens": len(stream.ids),
        "turns": stream.n_turns,
        "prompt_tokens": stream.prompt_length,
        "kl": mean(res.kl),
        "kl_max": max(res.kl, default=0.0),
        "top1": mean([float(a) for a in res.agree]),
        "logp_true": mean(res.logp_true),
        "logp_true_full": ref_lp,
        "probe_retrieved": res.probe_retrieved,
        "probe_logp": res.probe_logp,
        "probe_text": res.probe_text,
        "rounds": st.get("rounds"),
        "evicted": st.get("evicted"),
        "prefill_tokens": st.get("prefill_tokens"),
        "reused_tokens": st.get("reused_tokens", 0),
        "decode_tokens": st.get("decode_tokens"),
        "kv_bytes": st.get("total_kv_bytes"),
        "max_entries": max(st.get("entries") or [0]),
        "scoring_s": st.get("scoring_s"),
        "compaction_s": st.get("compaction_s"),
        "wall_s": res.wall_s,
        "kv_mean": kv_mean(stream, res),
        **({"extra_probes": res.extra_probes} if res.extra_probes else {}),
    }


def kv_mean(stream: Stream, res: rp.ReplayResult) -> float | None:
    """The run's mean KV entries over the episode: the fullest layer's entries after each segment,
    weighted by the segment's tokens (what the segments study matches budgets on)."""
    sizes = [len(s.ids) for s in stream.segments]
    if len(res.memory) < len(sizes) or not sum(sizes):
        return None
    return sum(n * e for n, (_, e) in zip(sizes, res.memory, strict=False)) / sum(sizes)


Grid = Sequence[RunSpec] | Callable[[Stream], Sequence[RunSpec]]


def pending_runs(engine, streams: Sequence[Stream], grid: Grid, records: list[dict], model_name: str):
    """(todo, skipped): the (stream, spec) pairs without a record yet, and why others cannot run.
    `grid`: the specs, or a function of the stream (per-episode budgets, as `bench study` has)."""
    done = {record_key(r) for r in records}
    skipped: list[str] = []
    todo: list[tuple[int, int, Stream, RunSpec]] = []
    for si, stream in enumerate(streams):
        for gi, s in enumerate(grid(stream) if callable(grid) else grid):
            why = check_setting(engine, s, stream)
            if why:
                skipped.append(f"{stream.name} {s.label}: {why}")
                continue
            if run_key(stream, s, model_name) not in done:
                todo.append((gi, si, stream, s))
    # Setting by setting, each over every episode: a run cut short leaves whole comparisons.
    todo.sort(key=lambda t: (t[0], t[1]))
    return list(dict.fromkeys((st, s) for _, _, st, s in todo)), skipped


def run_fidelity(
    engine,
    streams: Sequence[Stream],
    grid: Grid,
    out_dir: str | Path,
    model_name: str,
    progress=None,
    plot: bool = True,
    annotate: Callable[[Stream, rp.ReplayResult], dict] | None = None,
    concurrency: int = 1,
    refs: dict[str, rp.ReplayResult] | None = None,
    reuse_prefix: bool = True,
) -> list[dict]:
    """Run every (stream, spec) not already in `out_dir/fidelity.json`; rewrite the json after
    each run (atomically, so a crash keeps finished runs), then the table and the plot. `progress`:
    a `kvagent.bench.progress` target (default: nothing shown). `annotate(stream, result)`: extra
    fields for each record. `concurrency > 1`: that many policy runs at once, one thread each (on an
    engine loaded with `max_batch` > 1 their forwards are batched together). `refs`: full-cache
    runs by stream digest, used and filled (a caller that already ran one passes it on). Several
    processes may run on one `out_dir` (shared_results.py): each takes the next run no one holds.
    `reuse_prefix`: reprefill runs rebuild from the previous rebuild's dense state (replay.py;
    bit-identical logits, a few times faster; off holds less memory and times the protocol)."""
    progress = progress or NoProgress()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    records = load_records(out)
    todo, skipped = pending_runs(engine, streams, grid, records, model_name)
    evicting = [s for _, s in todo if s.policy != "full"] + [r for r in records if r.get("policy") != "full"]
    if skipped and not evicting:  # nothing would be compared: fail before the reference replays
        raise ConfigError(
            f"budgets: all {len(skipped)} evicting settings would be skipped, e.g. {skipped[0]}"
        )
    per_run = {st.name: len(st.ids) + (len(st.probe.question) if st.probe else 0) for st in streams}
    total = progress.task("settings", len(todo))
    lock = threading.Lock()
    # References first (one per episode, kept in memory and under out_dir/references: top-k rows of
    # scored tokens only), then the policy runs, which only read them and so can run side by side.
    refs = {} if refs is None else refs
    shared = SharedResults(out / RESULTS, record_key)
    fill_references(
        engine, (st for st, _ in todo), out, model_name, refs, progress, lambda st: per_run[st.name]
    )

    def run_one(item: tuple[Stream, RunSpec]) -> None:
        stream, s = item
        key = run_key(stream, s, model_name)
        if not shared.claim(key):  # done or in progress in another process on this out dir
            with lock:
                total.advance(1)
            return
        try:
            bar = progress.task(f"{stream.name} {s.label}", per_run[stream.name])
            rec = _run(stream, s, bar)
        except BaseException:  # also Ctrl-C and SIGTERM: the run is free for the next start
            shared.release(key)
            raise
        with lock:
            records[:] = shared.save(rec, skipped)
            bar.done()
            total.advance(1)

    def _run(stream: Stream, s: RunSpec, bar) -> dict:
        ref = refs[stream.digest()]
        if s.policy == "full" and not history_of(s):
            res = ref
        else:
            # A batched engine's session with a token budget holds a pool slot, which cannot be
            # branched (deep-copied) for the probe's greedy continuation: such runs skip the probe.
            probe = getattr(engine, "batcher", None) is None or not isinstance(s.budget, int)
            res = rp.policy_run(
                engine,
                stream,
                s.cache_config(),
                ref.reference,
                progress=bar.advance,
                probe=probe,
                reuse_prefix=reuse_prefix,
                before_append=masker_for(stream, s),
            )
        ref_lp = statistics.fmean(ref.logp_true) if ref.logp_true else float("nan")
        rec = summarise(s, stream, model_name, res, ref_lp)
        if annotate:
            rec.update(annotate(stream, res))
        return rec

    if concurrency > 1 and len(todo) > 1:
        pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="fidelity")
        try:
            for f in [pool.submit(run_one, item) for item in todo]:
                f.result()  # the first failure is raised; finished runs are already saved
        except BaseException:  # also Ctrl-C: queued runs are dropped, running ones end and are saved
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        pool.shutdown()
    else:
        for item in todo:
            run_one(item)
    records = shared.save(None, skipped)
    wanted = {(st.name, st.digest()) for st in streams}
    current = [r for r in records if (r["episode"], r["digest"]) in wanted and r["model"] == model_name]
    atomic_write_text(out / "fidelity.md", fidelity_markdown(current, skipped))
    if plot:
        from kvagent.bench.fidelity.plots import plot_fidelity

        plot_fidelity(current, out / "fidelity.png")
    return current
