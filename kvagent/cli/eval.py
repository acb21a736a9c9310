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

from kvagent.cli.common import agent_config, load_engine, parse_seeds
from kvagent.errors import KvagentError
from kvagent.evals.runner import EvalRun, EvalRunner, load_records, plan_runs
from kvagent.options import parse_budgets, parse_policy_args, split_list


class EvalTable:
    """Live table: per configuration done / running / resolved so far, plus the batch's ETA."""

    def __init__(self, specs: Sequence[EvalRun], done: dict[str, dict[str, Any]], console: Console) -> None:
        self.configs = list(dict.fromkeys(s.label for s in specs))
        self.total = {c: sum(1 for s in specs if s.label == c) for c in self.configs}
        self.done = {c: 0 for c in self.configs}
        self.resolved = {c: 0 for c in self.configs}
        self.running: dict[str, int] = {c: 0 for c in self.configs}
        for s in specs:
            if s.run_id in done:
                self.done[s.label] += 1
                self.resolved[s.label] += bool(done[s.run_id].get("resolved"))
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

    def __call__(self, event: str, spec: EvalRun, record: dict[str, Any] | None) -> None:
        with self.lock:
            c = spec.label
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
    policies: str,
    modes: str,
    budgets: str,
    seeds: str,
    model: str,
    cache_options: dict[str, Any],
    policy_arg: Sequence[str] | None,
    agent: dict[str, Any],
    env: str,
    repos: str | None,
    grade: bool,
    workers: int,
    out: str,
    device: str = "auto",
    dtype: str = "auto",
    console: Console | None = None,
) -> dict[str, Any]:
    from kvagent.cli import environments
    from kvagent.evals.datasets import load_instances
    from kvagent.evals.report import write_report

    console = console or Console(stderr=True)
    names = split_list(policies, "policies")
    seed_list, budget_list = parse_seeds(seeds), parse_budgets(budgets)
    agent_cfg = agent_config(**agent)
    args = parse_policy_args(policy_arg, names)
    selected = load_instances(dataset, split=split, select=instances)
    # Bad policy names, options or budgets fail here, before a model loads or a run starts.
    runs = plan_runs([i.instance_id for i in selected], names, split_list(modes, "modes"), budget_list,
                     seed_list, policy_args=args, **cache_options)  # fmt: skip
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
    left = [r for r in runs if r.run_id not in done]
    console.print(f"{len(runs)} runs planned, {len(runs) - len(left)} already finished in {run_dir}")
    if left:
        console.print(f"loading model {model} ...")
        engine = load_engine(model, device=device, dtype=dtype)
        table = EvalTable(runs, done, console)
        runner = EvalRunner(
            run_dir=run_dir,
            engine=engine,
            instances={i.instance_id: i for i in selected},
            open_env=open_env,
            agent_config=agent_cfg,
            grade=grader if grade else None,
            model_name=model,
            workers=workers,
            on_update=table,
        )
        with table.live:
            runner.run(runs)
    summary = write_report(run_dir)
    console.print(f"report: {run_dir / 'report.md'}")
    return summary
