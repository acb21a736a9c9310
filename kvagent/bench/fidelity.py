"""`kvagent bench fidelity`: every episode under every setting (policy x mode x scope x budget x
protect), compared token by token with the full-cache run; resumable results in `fidelity.json`."""

from __future__ import annotations

import itertools
import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from kvagent.bench import replay as rp
from kvagent.bench.stream import Stream
from kvagent.errors import ConfigError
from kvagent.fileio import atomic_write_json, atomic_write_text
from kvagent.runtime.config import MODES, PROTECT, SCOPES, CacheConfig

RESULTS = "fidelity.json"


@dataclass(frozen=True)
class Setting:
    policy: str
    mode: str = "persistent"
    scope: str = "prefill+decode"
    protect: str = "prompt"
    budget: int | float | None = None
    buffer: int = 128
    window: int = 16
    seed: int = 0

    def config(self) -> CacheConfig:
        return CacheConfig(
            policy=self.policy,
            budget=self.budget,
            buffer=self.buffer,
            protect=self.protect,
            scope=self.scope,
            mode=self.mode,
            window=self.window,
            seed=self.seed,
        )

    def label(self) -> str:
        if self.policy == "full":
            return "full"
        return f"{self.policy}/{self.mode}/{self.scope}/protect={self.protect}/K={self.budget}"


def make_grid(policies, modes, scopes, budgets, protects, buffer: int = 128, window: int = 16, seed: int = 0):
    """Settings to run; `full` once (it never evicts, so mode, scope and budget do not apply)."""
    from kvagent.runtime.policies import available

    for p in policies:
        if p not in available():
            raise ConfigError(f"policies: unknown policy {p!r}; choose from {', '.join(available())}")
    for m in modes:
        if m not in MODES:
            raise ConfigError(f"modes: unknown mode {m!r}; choose from {', '.join(MODES)}")
    for s in scopes:
        if s not in SCOPES:
            raise ConfigError(f"scopes: unknown scope {s!r}; choose from {', '.join(SCOPES)}")
    for pr in protects:
        if pr not in PROTECT:
            raise ConfigError(f"protect: unknown value {pr!r}; choose from {', '.join(PROTECT)}")
    if buffer < 1:
        raise ConfigError(f"buffer: must be >= 1, got {buffer}")
    grid = [Setting("full", buffer=buffer, window=window, seed=seed)]
    for p, m, s, b, pr in itertools.product(policies, modes, scopes, budgets, protects):
        if p == "full":
            continue
        st = Setting(p, m, s, pr, b, buffer, window, seed)
        st.config()  # validates field values now, not hours into a run
        grid.append(st)
    return grid


def check_setting(engine, setting: Setting, stream: Stream) -> str | None:
    """Why this setting cannot run on this episode (None if it can)."""
    if setting.policy == "full":
        return None
    try:
        engine.session(setting.config())  # block-multiple and context-limit checks
    except ConfigError as e:
        raise ConfigError(f"{setting.label()}: {e}") from None
    b = setting.budget
    if setting.protect == "prompt" and isinstance(b, int) and stream.prompt_length >= b:
        return f"protect=prompt keeps all {stream.prompt_length} prompt tokens but K={b}; raise the budget"
    return None


# ----------------------------------------------------------------------- records
def record_key(rec: dict) -> tuple:
    return tuple(
        rec.get(k)
        for k in (
            "episode",
            "digest",
            "model",
            "policy",
            "mode",
            "scope",
            "protect",
            "budget",
            "buffer",
            "window",
            "seed",
        )
    )


def load_records(out_dir: Path) -> list[dict]:
    path = out_dir / RESULTS
    if not path.exists():
        return []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not valid JSON ({e.msg}); move it away to start afresh") from None
    return list(data.get("records", []))


def summarise(setting: Setting, stream: Stream, model: str, res: rp.ReplayResult, ref_lp: float) -> dict:
    n = len(res.kl)
    mean = (lambda xs: sum(xs) / len(xs)) if n else (lambda xs: float("nan"))
    st = res.stats
    return {
        **asdict(setting),
        "status": "ok",
        "episode": stream.name,
        "digest": stream.digest(),
        "model": model,
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
        "decode_tokens": st.get("decode_tokens"),
        "kv_bytes": st.get("total_kv_bytes"),
        "max_entries": max(st.get("entries") or [0]),
        "scoring_s": st.get("scoring_s"),
        "compaction_s": st.get("compaction_s"),
        "wall_s": res.wall_s,
    }


def run_fidelity(
    engine,
    streams: Sequence[Stream],
    grid: Sequence[Setting],
    out_dir: str | Path,
    model_name: str,
    show_progress: bool = True,
    plot: bool = True,
) -> list[dict]:
    """Run every (stream, setting) not already in `out_dir/fidelity.json`; rewrite the json after
    each run (atomically, so a crash keeps finished runs), then the table and the plot."""
    from kvagent.bench.progress import Progress

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    records = load_records(out)
    done = {record_key(r) for r in records}
    skipped = []
    todo: list[tuple[Stream, Setting]] = []
    for stream in streams:
        for s in grid:
            why = check_setting(engine, s, stream)
            if why:
                skipped.append(f"{stream.name} {s.label()}: {why}")
                continue
            key = record_key(
                {**asdict(s), "episode": stream.name, "digest": stream.digest(), "model": model_name}
            )
            if key not in done:
                todo.append((stream, s))
    refs: dict[str, rp.ReplayResult] = {}
    per_run = {st.name: len(st.ids) + (len(st.probe.question) if st.probe else 0) for st in streams}
    with Progress(enabled=show_progress) as prog:
        total = prog.task("settings", len(todo))
        for stream, s in todo:
            need_ref = stream.digest() not in refs
            tokens = per_run[stream.name] * (2 if need_ref and s.policy != "full" else 1)
            bar = prog.task(f"{stream.name} {s.label()}", tokens)
            if need_ref:
                refs[stream.digest()] = rp.reference_run(engine, stream, progress=bar.advance)
            ref = refs[stream.digest()]
            if s.policy == "full":
                res = ref
            else:
                res = rp.policy_run(engine, stream, s.config(), ref.reference, progress=bar.advance)
            ref_lp = statistics.fmean(ref.logp_true) if ref.logp_true else float("nan")
            records.append(summarise(s, stream, model_name, res, ref_lp))
            atomic_write_json(out / RESULTS, {"records": records, "skipped": skipped})
            bar.done()
            total.advance(1)
    atomic_write_json(out / RESULTS, {"records": records, "skipped": skipped})
    wanted = {(st.name, st.digest()) for st in streams}
    current = [r for r in records if (r["episode"], r["digest"]) in wanted and r["model"] == model_name]
    from kvagent.bench.tables import fidelity_markdown

    atomic_write_text(out / "fidelity.md", fidelity_markdown(current, skipped))
    if plot:
        from kvagent.bench.plots import plot_fidelity

        plot_fidelity(current, out / "fidelity.png")
    return current
