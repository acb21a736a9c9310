"""The eval runner: instances x policies x modes x budgets x seeds, resumable.

Layout of a run directory:
  runs.jsonl                     one record per finished run (appended atomically; the source of truth)
  trajectories/<run_id>.traj.json
  predictions/<config>__s<seed>.jsonl   SWE-bench predictions, rebuilt from runs.jsonl
  grading/<run_id>/              grading logs
A run without a record in runs.jsonl is (re)done on the next invocation; one with a record never is.
"""

from __future__ import annotations

import contextlib
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
from kvagent.fileio import append_jsonl, atomic_write_text

RUNS_FILE = "runs.jsonl"
# `full` never evicts, so persistent and reprefill are the same computation: run it once and
# record it under every requested mode.
CANONICAL_DENSE_MODE = "persistent"


def budget_label(budget: int | float | None) -> str:
    return "dense" if budget is None else f"K{budget}"


@dataclass(frozen=True)
class RunSpec:
    instance_id: str
    policy: str
    mode: str
    budget: int | float | None
    seed: int

    @property
    def config_label(self) -> str:
        return f"{self.policy}__{self.mode}__{budget_label(self.budget)}"

    @property
    def run_id(self) -> str:
        return f"{self.instance_id}__{self.config_label}__s{self.seed}"

    @property
    def canonical(self) -> RunSpec:
        """The run whose result this one reuses (itself, except for dense runs in other modes)."""
        if self.policy == "full" and self.mode != CANONICAL_DENSE_MODE:
            return replace(self, mode=CANONICAL_DENSE_MODE)
        return self


def plan_runs(
    instance_ids: Sequence[str],
    policies: Sequence[str],
    modes: Sequence[str],
    budgets: Sequence[int | float | None],
    seeds: Sequence[int],
) -> list[RunSpec]:
    """Every (instance, seed, policy, mode, budget), `full` once per mode with no budget."""
    if not instance_ids:
        raise KvagentError("eval: no instances selected; check --dataset and --instances")
    evicting = [b for b in budgets if b is not None]
    if any(p != "full" for p in policies) and not evicting:
        raise KvagentError("eval: evicting policies need at least one --budgets value (e.g. 1024)")
    specs: list[RunSpec] = []
    for iid in instance_ids:
        for seed in seeds:
            for policy in policies:
                for mode in modes:
                    for budget in [None] if policy == "full" else evicting:
                        specs.append(RunSpec(iid, policy, mode, budget, seed))
    return list(dict.fromkeys(specs))


def load_records(run_dir: Path) -> dict[str, dict[str, Any]]:
    """Finished runs by run_id. A torn last line (writer killed mid-write) is ignored: that run is
    simply redone."""
    path = run_dir / RUNS_FILE
    records: dict[str, dict[str, Any]] = {}
    if not path.exists():
        return records
    for line in path.read_text(encoding="utf-8").splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            rec = json.loads(line)
            if isinstance(rec, dict) and "run_id" in rec:
                records.setdefault(rec["run_id"], rec)
    return records


@dataclass
class EvalRunner:
    """Runs specs with one shared engine; each run gets its own sandbox and session."""

    run_dir: Path
    engine: Any  # kvagent.runtime.Engine or a test double (tokenizer + session(config))
    instances: Mapping[str, Instance]
    open_env: Callable[[Instance], Any]  # -> context manager yielding a Sandbox
    agent_config: AgentConfig = field(default_factory=AgentConfig)
    cache_options: Mapping[str, Any] = field(default_factory=dict)  # buffer, scope, protect, window
    policy_args: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # per policy
    grade: Callable[[Instance, str, Path], Mapping[str, Any]] | None = None
    model_name: str = "kvagent"
    workers: int = 1
    on_update: Callable[[str, RunSpec, dict[str, Any] | None], None] | None = None

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir)
        self._lock = threading.Lock()
        if self.workers < 1:
            raise KvagentError(f"workers: must be >= 1, got {self.workers}")

    # -------------------------------------------------------------------- orchestration
    def pending(self, specs: Iterable[RunSpec]) -> list[RunSpec]:
        done = load_records(self.run_dir)
        return [s for s in specs if s.run_id not in done]

    def run(self, specs: Sequence[RunSpec]) -> list[dict[str, Any]]:
        """Run what is not finished yet; returns the records of all `specs`."""
        unknown = sorted({s.instance_id for s in specs} - set(self.instances))
        if unknown:
            raise KvagentError(f"eval: unknown instance(s) {', '.join(unknown[:5])}; check --instances")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        todo = self.pending(specs)
        done = set(load_records(self.run_dir))
        to_execute = list(dict.fromkeys(s.canonical for s in todo if s.canonical.run_id not in done))
        for spec, record in self._execute(to_execute):
            self._store(spec, record)
        self._derive(todo)
        records = load_records(self.run_dir)
        self.write_predictions(records.values())
        return [records[s.run_id] for s in specs if s.run_id in records]

    def _execute(self, specs: list[RunSpec]) -> Iterator[tuple[RunSpec, dict[str, Any]]]:
        if self.workers == 1:
            # In the calling thread, so Ctrl-C stops the episode at once.
            for spec in specs:
                yield spec, self.run_one(spec)
            return
        pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="kvagent-eval")
        try:
            queue = iter(specs)
            running = {pool.submit(self.run_one, s): s for s in _take(queue, self.workers)}
            while running:
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in finished:
                    spec = running.pop(fut)
                    yield spec, fut.result()
                    for nxt in _take(queue, 1):
                        running[pool.submit(self.run_one, nxt)] = nxt
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def _store(self, spec: RunSpec, record: dict[str, Any]) -> None:
        with self._lock:
            append_jsonl(self.run_dir / RUNS_FILE, record)
        if self.on_update:
            self.on_update("done", spec, record)

    def _derive(self, todo: Sequence[RunSpec]) -> None:
        """Record dense runs of other modes from their canonical run."""
        records = load_records(self.run_dir)
        for spec in todo:
            if spec.canonical == spec or spec.run_id in records:
                continue
            base = records.get(spec.canonical.run_id)
            if base is None:
                continue
            derived = {**base, "run_id": spec.run_id, "mode": spec.mode, "config": spec.config_label}
            derived["derived_from"] = base["run_id"]
            self._store(spec, derived)

    # -------------------------------------------------------------------- one run
    def cache_config(self, spec: RunSpec) -> Any:
        from kvagent.runtime import CacheConfig

        return CacheConfig(
            policy=spec.policy,
            budget=spec.budget,
            mode=spec.mode,
            seed=spec.seed,
            policy_args=dict(self.policy_args.get(spec.policy, {})),
            **self.cache_options,
        )

    def run_one(self, spec: RunSpec) -> dict[str, Any]:
        if self.on_update:
            self.on_update("start", spec, None)
        instance = self.instances[spec.instance_id]
        trajectory = self.run_dir / "trajectories" / f"{spec.run_id}.traj.json"
        started = time.time()
        result = None
        error = None
        try:
            with self.open_env(instance) as env:
                result = solve_episode(
                    self.engine,
                    env,
                    instance.problem_statement,
                    cache_config=self.cache_config(spec),
                    config=replace(self.agent_config, seed=spec.seed),
                    trajectory_path=trajectory,
                    meta={"run_id": spec.run_id, "instance_id": spec.instance_id, "spec": spec.__dict__},
                )
        except KvagentError as e:
            error = str(e)  # e.g. a missing image: recorded, and the batch goes on
        patch = result.patch if result is not None else ""
        grading: Mapping[str, Any] = {}
        if self.grade is not None and result is not None:
            grading = self.grade(instance, patch, self.run_dir / "grading" / spec.run_id)
        last = _last_cache(result)
        return {
            "run_id": spec.run_id,
            "config": spec.config_label,
            "instance_id": spec.instance_id,
            "policy": spec.policy,
            "mode": spec.mode,
            "budget": spec.budget,
            "seed": spec.seed,
            "model": self.model_name,
            "exit_status": result.exit_status if result is not None else "error",
            "error": error or (result.error if result is not None else None),
            "resolved": bool(grading.get("resolved", False)),
            "grade_status": grading.get("status") if grading else None,
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


def _take(it: Iterator[RunSpec], n: int) -> list[RunSpec]:
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
