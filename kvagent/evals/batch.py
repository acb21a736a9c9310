"""`kvagent eval`: plan the runs, load the model once, run them with a live table, write the report."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from kvagent.errors import KvagentError
from kvagent.evals.runner import EvalRunner, RunSpec, load_records, plan_runs


class EvalTable:
    """Live table: per configuration done / running / resolved so far, plus the batch's ETA."""

    def __init__(self, specs: Sequence[RunSpec], done: dict[str, dict[str, Any]], console: Console) -> None:
        self.configs = list(dict.fromkeys(s.config_label for s in specs))
        self.total = {c: sum(1 for s in specs if s.config_label == c) for c in self.configs}
        self.done = {c: 0 for c in self.configs}
        self.resolved = {c: 0 for c in self.configs}
        self.running: dict[str, int] = {c: 0 for c in self.configs}
        for s in specs:
            if s.run_id in done:
                self.done[s.config_label] += 1
                self.resolved[s.config_label] += bool(done[s.run_id].get("resolved"))
        self.started = time.time()
        self.finished_here = 0
        self.lock = threading.Lock()
        self.live = Live(self.render(), console=console, refresh_per_second=2)

    def render(self) -> Table:
        table = Table(title="kvagent eval")
        for col in ("configuration", "done", "running", "resolved"):
            table.add_column(col, justify="left" if col == "configuration" else "right")
        for c in self.configs:
            table.add_row(c, f"{self.done[c]}/{self.total[c]}", str(self.running[c]), str(self.resolved[c]))
        left = sum(self.total.values()) - sum(self.done.values())
        if self.finished_here:
            eta = (time.time() - self.started) / self.finished_here * left
            table.caption = f"{left} runs left, ETA {eta / 60:.1f} min"
        else:
            table.caption = f"{left} runs left"
        return table

    def __call__(self, event: str, spec: RunSpec, record: dict[str, Any] | None) -> None:
        with self.lock:
            c = spec.config_label
            if event == "start":
                self.running[c] += 1
            elif event == "done":
                if record is not None and "derived_from" not in record:  # derived runs never started
                    self.running[c] = max(0, self.running[c] - 1)
                self.done[c] += 1
                self.finished_here += 1
                self.resolved[c] += bool(record and record.get("resolved"))
            self.live.update(self.render())


def run_eval(
    *,
    dataset: str,
    split: str,
    instances: str | None,
    policies: Sequence[str],
    modes: Sequence[str],
    budgets: Sequence[int | float | None],
    seeds: Sequence[int],
    model: str,
    cache_options: dict[str, Any],
    policy_args: dict[str, dict[str, Any]],
    agent_config: Any,
    env: str,
    repos: str | None,
    grade: bool,
    workers: int,
    out: str,
    device: str = "auto",
    dtype: str = "auto",
    console: Console | None = None,
) -> dict[str, Any]:
    from kvagent.evals import environments
    from kvagent.evals.datasets import load_instances
    from kvagent.evals.report import write_report
    from kvagent.runtime import CacheConfig, Engine

    console = console or Console(stderr=True)
    selected = load_instances(dataset, split=split, select=instances)
    specs = plan_runs([i.instance_id for i in selected], policies, modes, budgets, seeds)
    # Bad policy names, arguments or budgets fail here, before a model loads or a run starts.
    for policy, budget, mode in dict.fromkeys((s.policy, s.budget, s.mode) for s in specs):
        CacheConfig(
            policy=policy, budget=budget, mode=mode, policy_args=policy_args.get(policy, {}), **cache_options
        )
    if env == "local":
        if not repos:
            raise KvagentError("eval: --env local needs --repos DIR holding one checkout per instance id")
        open_env, grader = environments.local_env(Path(repos)), environments.local_grader(Path(repos))
        for inst in selected:
            environments.local_repo(Path(repos), inst)
    elif env == "docker":
        open_env, grader = environments.docker_env, environments.docker_grader
    else:
        raise KvagentError(f"env: got {env!r}; choose docker or local")
    run_dir = Path(out)
    done = load_records(run_dir)
    left = [s for s in specs if s.run_id not in done]
    console.print(f"{len(specs)} runs planned, {len(specs) - len(left)} already finished in {run_dir}")
    if left:
        console.print(f"loading model {model} ...")
        engine = Engine.load(model, device=device, dtype=dtype)
        table = EvalTable(specs, done, console)
        runner = EvalRunner(
            run_dir=run_dir,
            engine=engine,
            instances={i.instance_id: i for i in selected},
            open_env=open_env,
            agent_config=agent_config,
            cache_options=cache_options,
            policy_args=policy_args,
            grade=grader if grade else None,
            model_name=model,
            workers=workers,
            on_update=table,
        )
        with table.live:
            runner.run(specs)
    summary = write_report(run_dir)
    console.print(f"report: {run_dir / 'report.md'}")
    return summary
