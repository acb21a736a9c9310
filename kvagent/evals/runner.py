"""The eval runner: instances x policies x modes x budgets x seeds, resumable.

Layout of a run directory:
  runs.jsonl                     one record per run (appended atomically; the source of truth)
  trajectories/<run_id>.traj.json
  predictions/<config>__s<seed>.jsonl   SWE-bench predictions, rebuilt from runs.jsonl
  grading/<run_id>/              grading logs
A run without a finished record in runs.jsonl is (re)done on the next invocation; one with a finished
record never is. A run that hit an infrastructure error (`infra_error: true`: no image, a sandbox or
grader that failed, a crashed episode) is recorded as such, not counted in Pass@1, and redone.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kvagent.agent.config import AgentConfig
from kvagent.agent.solve import solve_episode
from kvagent.errors import KvagentError
from kvagent.evals.datasets import Instance
from kvagent.evals.stats import is_infra_error, settle
from kvagent.fileio import append_jsonl, atomic_write_text, read_jsonl
from kvagent.runspec import DEFAULT_PROTECT, DEFAULT_SCOPE, RunSpec, sweep

RUNS_FILE = "runs.jsonl"


@dataclass(frozen=True)
class EvalRun:
    """One episode of a sweep: a run spec on an instance."""

    instance_id: str
    spec: RunSpec

    @property
    def label(self) -> str:
        return self.spec.label

    @property
    def run_id(self) -> str:
        return f"{self.instance_id}__{self.spec.label}__s{self.spec.seed}"

    @property
    def canonical(self) -> EvalRun:
        """The run whose result this one reuses (itself, except for dense runs in other modes)."""
        return replace(self, spec=self.spec.canonical)

    def meta(self) -> dict[str, Any]:
        return {"instance_id": self.instance_id, **self.spec.record()}


def plan_runs(
    instance_ids: Sequence[str],
    policies: Sequence[str],
    modes: Sequence[str],
    budgets: Sequence[int | float | None],
    seeds: Sequence[int],
    *,
    policy_args: Mapping[str, Mapping[str, Any]] | None = None,
    **cache_options: Any,
) -> list[EvalRun]:
    """Every (instance, seed, policy, mode, budget), `full` once per mode with no budget; the specs
    are checked before any run starts. `cache_options`: any other CacheConfig field, one value each
    (buffer, scope, protect, window, ...)."""
    if not instance_ids:
        raise KvagentError("eval: no instances selected; check --dataset and --instances")
    if any(p != "full" for p in policies) and not [b for b in budgets if b is not None]:
        raise KvagentError("eval: evicting policies need at least one --budgets value (e.g. 1024)")
    scope, protect = cache_options.pop("scope", DEFAULT_SCOPE), cache_options.pop("protect", DEFAULT_PROTECT)
    specs = sweep(policies, modes, budgets, seeds, scopes=[scope], protects=[protect],
                  policy_args={k: dict(v) for k, v in (policy_args or {}).items()}, **cache_options)  # fmt: skip
    return [EvalRun(iid, spec) for iid in instance_ids for spec in specs]


def load_records(run_dir: Path, *, errors: bool = False) -> dict[str, dict[str, Any]]:
    """Finished runs by run_id (the last finished record of each); with `errors`, also the runs that so
    far only hit infrastructure errors (their last record)."""
    path = Path(run_dir) / RUNS_FILE
    if not path.exists():
        return {}
    recs = (rec for _, rec in read_jsonl(path) if isinstance(rec, dict) and "run_id" in rec)
    settled = settle(recs, lambda r: r["run_id"])
    return {k: r for k, r in settled.items() if errors or not is_infra_error(r)}


@dataclass
class EvalRunner:
    """Runs an eval's runs with one shared engine; each run gets its own sandbox and session."""

    run_dir: Path
    engine: Any  # kvagent.runtime.Engine or a test double (tokenizer + session(config))
    instances: Mapping[str, Instance]
    open_env: Callable[[Instance], Any]  # -> context manager yielding a Sandbox
    agent_config: AgentConfig = field(default_factory=AgentConfig)
    grade: Callable[[Instance, str, Path], Mapping[str, Any]] | None = None
    model_name: str = "kvagent"
    concurrency: int = 1  # episodes at once (`--concurrency`), one thread each
    on_update: Callable[[str, EvalRun, dict[str, Any] | None], None] | None = None
    # Each episode's agent events (replies, observations, end), e.g. a live display of one episode.
    on_event: Callable[[Any], None] | None = None

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir)
        self._lock = threading.Lock()
        if self.concurrency < 1:
            raise KvagentError(f"concurrency: must be >= 1, got {self.concurrency}")

    # -------------------------------------------------------------------- orchestration
    def pending(self, runs: Iterable[EvalRun]) -> list[EvalRun]:
        done = load_records(self.run_dir)
        return [r for r in runs if r.run_id not in done]

    def run(
        self,
        runs: Sequence[EvalRun],
        execute: Callable[[list[EvalRun]], Iterable[tuple[EvalRun, dict[str, Any]]]] | None = None,
    ) -> list[dict[str, Any]]:
        """Run what is not finished yet; returns the records of all `runs`. `execute` runs the
        episodes elsewhere (default: here, `concurrency` at a time; kvagent.evals.distributed: on Ray
        actors) and yields (run, record) as each finishes; this runner records them."""
        unknown = sorted({r.instance_id for r in runs} - set(self.instances))
        if unknown:
            raise KvagentError(f"eval: unknown instance(s) {', '.join(unknown[:5])}; check --instances")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        todo = self.pending(runs)
        done = set(load_records(self.run_dir))
        to_execute = list(dict.fromkeys(r.canonical for r in todo if r.canonical.run_id not in done))
        for run, record in (execute or self._execute)(to_execute):
            self._store(run, record)
        self._derive(todo)
        # A run that only hit infrastructure errors so far: its last error record (`infra_error`).
        records = load_records(self.run_dir, errors=True)
        self.write_predictions(r for r in records.values() if not is_infra_error(r))
        return [records[r.run_id] for r in runs if r.run_id in records]

    def _execute(self, runs: list[EvalRun]) -> Iterator[tuple[EvalRun, dict[str, Any]]]:
        if self.concurrency == 1:
            # In the calling thread, so Ctrl-C stops the episode at once.
            for run in runs:
                yield run, self.run_one(run)
            return
        pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="kvagent-eval")
        try:
            queue = iter(runs)
            running = {pool.submit(self.run_one, r): r for r in _take(queue, self.concurrency)}
            while running:
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in finished:
                    run = running.pop(fut)
                    yield run, fut.result()
                    for nxt in _take(queue, 1):
                        running[pool.submit(self.run_one, nxt)] = nxt
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def _store(self, run: EvalRun, record: dict[str, Any]) -> None:
        with self._lock:
            append_jsonl(self.run_dir / RUNS_FILE, record)
        if self.on_update:
            self.on_update("done", run, record)

    def _derive(self, todo: Sequence[EvalRun]) -> None:
        """Record dense runs of other modes from their canonical run."""
        records = load_records(self.run_dir)
        for run in todo:
            if run.canonical == run or run.run_id in records:
                continue
            base = records.get(run.canonical.run_id)
            if base is None:
                continue
            derived = {**base, **run.spec.record(), "run_id": run.run_id, "config": run.label}
            derived["derived_from"] = base["run_id"]
            self._store(run, derived)

    # -------------------------------------------------------------------- one run
    def run_one(self, run: EvalRun) -> dict[str, Any]:
        if self.on_update:
            self.on_update("start", run, None)
        spec = run.spec
        instance = self.instances[run.instance_id]
        trajectory = self.run_dir / "trajectories" / f"{run.run_id}.traj.json"
        started = time.time()
        result = None
        error = None
        try:
            # Any failure here is the infrastructure's (bad settings were checked before the first
            # run): recorded, and the batch goes on.
            with self.open_env(instance) as env:
                result = solve_episode(
                    self.engine,
                    env,
                    instance.problem_statement,
                    cache_config=spec.cache_config(),
                    config=replace(self.agent_config, seed=spec.seed),
                    trajectory_path=trajectory,
                    meta={"run_id": run.run_id, "instance_id": run.instance_id, "spec": run.meta()},
                    on_event=self.on_event,
                )
        except KvagentError as e:
            error = str(e)
        except Exception as e:
            error = f"{type(e).__name__}: {e}"
        patch = result.patch if result is not None else ""
        grading: Mapping[str, Any] = {}
        crashed = result is None or result.exit_status == "error"
        if self.grade is not None and not crashed:
            try:
                grading = self.grade(instance, patch, self.run_dir / "grading" / run.run_id)
            except Exception as e:
                grading = {"status": "error", "error": f"grading: {type(e).__name__}: {e}", "infra": True}
        last = _last_cache(result)
        grade_infra = bool(grading.get("infra"))
        return {
            "run_id": run.run_id,
            "config": run.label,
            "instance_id": run.instance_id,
            **spec.record(),  # what identifies the run (RunSpec.from_record reads it back)
            "model": self.model_name,
            "scaffold": self.agent_config.scaffold,  # protocol profile (docs/deepswe.md)
            "history": self.agent_config.history,
            "patch_rule": result.graded_patch if result is not None else self.agent_config.patch_rule,
            # the sampling used and where each value came from (a flag, the model's generation config)
            "sampling": (result.config if result is not None else self.agent_config).sampling_record(),
            "exit_status": result.exit_status if result is not None else "error",
            "error": error or (result.error if result is not None else None) or grading.get("error"),
            "infra_error": crashed or grade_infra,
            "resolved": bool(grading.get("resolved", False)),
            "grade_status": grading.get("status") if grading else None,
            # The image could not run the tests (an infra error: not counted, redone), and an image
            # on another Python than swebench's spec (evals/interpreter.py): both named in the report.
            "env_error": grading.get("env_error"),
            "environment": grading.get("environment"),
            "steps": result.steps if result is not None else 0,
            "tokens": result.logical_length if result is not None else 0,
            "evictions": last.get("rounds", 0),
            "evicted_entries": last.get("evicted", 0),
            "kv_bytes": last.get("total_kv_bytes", 0),
            "prefill_tokens": last.get("prefill_tokens", 0),
            "model_patch": patch,
            "trajectory": str(trajectory.relative_to(self.run_dir)) if result is not None else None,
            "elapsed_s": round(time.time() - started, 2),
        }

    # -------------------------------------------------------------------- predictions
    def write_predictions(self, records: Iterable[Mapping[str, Any]]) -> None:
        """SWE-bench predictions per (configuration, seed), rebuilt from the records."""
        groups: dict[str, list[dict[str, Any]]] = {}
        for rec in records:
            name = f"{rec['config']}__s{rec['seed']}"
            groups.setdefault(name, []).append(
                {
                    "instance_id": rec["instance_id"],
                    "model_name_or_path": f"{rec.get('model', self.model_name)}__{name}",
                    "model_patch": rec.get("model_patch", ""),
                }
            )
        for name, preds in groups.items():
            text = "".join(json.dumps(p) + "\n" for p in sorted(preds, key=lambda p: p["instance_id"]))
            atomic_write_text(self.run_dir / "predictions" / f"{name}.jsonl", text)


def _take(it: Iterator[EvalRun], n: int) -> list[EvalRun]:
    out = []
    for _ in range(n):
        try:
            out.append(next(it))
        except StopIteration:
            break
    return out


def _last_cache(result: Any) -> dict[str, Any]:
    if result is None:
        return {}
    for turn in reversed(result.turns):
        if turn.cache:
            return turn.cache
    return {}
