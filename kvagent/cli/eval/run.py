"""`kvagent eval`: plan the runs, load the model once, run them with a live table, write the report."""

from __future__ import annotations

import contextlib
import functools
import json
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from kvagent.cli.common import check_engine, check_out_dir, load_engine, sandbox_workdir
from kvagent.cli.settings import AgentOptions, CacheOptions, EngineOptions
from kvagent.errors import ConfigError, KvagentError
from kvagent.evals.datasets import Instance
from kvagent.evals.runner import EvalRun, EvalRunner, load_records, plan_runs
from kvagent.evals.stats import is_infra_error
from kvagent.fileio import atomic_write_text
from kvagent.options import parse_budgets, parse_policy_args, parse_seeds, split_list

GRID_FILE = "grid.yaml"


class EvalTable:
    """Live table: per configuration done / running / errors / resolved so far, plus the batch's ETA
    (from this invocation's throughput, so it counts parallel episodes)."""

    def __init__(self, runs: Sequence[EvalRun], done: dict[str, dict[str, Any]], console: Console) -> None:
        self.configs = list(dict.fromkeys(r.label for r in runs))
        self.total = {c: sum(1 for r in runs if r.label == c) for c in self.configs}
        self.done = {c: 0 for c in self.configs}
        self.resolved = {c: 0 for c in self.configs}
        self.errors = {c: 0 for c in self.configs}
        self.running: dict[str, int] = {c: 0 for c in self.configs}
        for r in runs:
            if r.run_id in done:
                self.done[r.label] += 1
                self.resolved[r.label] += bool(done[r.run_id].get("resolved"))
        self.started = time.time()
        self.finished_here = 0
        self.lock = threading.Lock()
        self.live = Live(self.render(), console=console, refresh_per_second=2)

    def left(self) -> int:
        return sum(self.total.values()) - sum(self.done.values()) - sum(self.errors.values())

    def render(self) -> Table:
        table = Table(title="kvagent eval")
        for col in ("configuration", "done", "running", "errors", "resolved"):
            table.add_column(col, justify="left" if col == "configuration" else "right")
        for c in self.configs:
            errors = f"[red]{self.errors[c]}[/red]" if self.errors[c] else "0"
            table.add_row(
                c, f"{self.done[c]}/{self.total[c]}", str(self.running[c]), errors, str(self.resolved[c])
            )
        left = self.left()
        caption = f"{left} runs left"
        if self.finished_here and left:
            eta = (time.time() - self.started) / self.finished_here * left
            caption += f", ETA {_duration(eta)}"
        elif left:
            caption += ", ETA after the first run"
        if sum(self.errors.values()):
            caption += f"; {sum(self.errors.values())} infrastructure errors (redone on the next run)"
        table.caption = caption
        return table

    def __call__(self, event: str, run: EvalRun, record: dict[str, Any] | None) -> None:
        with self.lock:
            c = run.label
            if event == "start":
                self.running[c] += 1
            elif event == "done":
                if record is not None and "derived_from" not in record:  # derived runs never started
                    self.running[c] = max(0, self.running[c] - 1)
                if record is not None and is_infra_error(record):
                    self.errors[c] += 1
                else:
                    self.done[c] += 1
                    self.resolved[c] += bool(record and record.get("resolved"))
                self.finished_here += 1
            self.live.update(self.render())


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


# ----------------------------------------------------------------------------- the grid file
# Options a grid file may not set: where it is, and how the run is launched rather than what it is.
NOT_IN_GRID = ("config", "workers")
LIST_OPTIONS = ("instances", "policies", "modes", "budgets", "seeds")


def grid_defaults(path: str, options: Sequence[str]) -> dict[str, Any]:
    """The settings of a grid file (YAML: `policies: [full, nexus]`, `budgets: [1024, 0.2]`,
    `policy_arg: {nexus: {lam: 0.5}}`, `max_steps: 50`, ... keys are eval's option names) as
    defaults for those options: an option given on the command line overrides its key."""
    import yaml

    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"config: grid file {path} not found; pass a YAML file of eval options")
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        line = f" line {where.line + 1}" if where is not None else ""
        raise ConfigError(f"config: {path}{line} is not valid YAML ({getattr(e, 'problem', e)})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config: {path} must be a mapping of option: value, got {type(data).__name__}")
    allowed = [o for o in options if o not in NOT_IN_GRID]
    settings = {str(k).replace("-", "_"): v for k, v in data.items()}
    unknown = [k for k in settings if k not in allowed]
    if unknown:
        raise ConfigError(
            f"config: {path} has unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(sorted(allowed))}"
        )
    out = {}
    for key, value in settings.items():
        if key in LIST_OPTIONS and isinstance(value, list):
            value = ",".join(str(v) for v in value)
        elif key == "policy_arg":
            value = _policy_arg_items(value, path)
        elif key in ("budgets", "seeds") and isinstance(value, int | float):
            value = str(value)
        out[key] = value
    return out


_KINDS = {bool: "true or false", int: "a whole number", float: "a number", str: "text"}


def typed_grid(path: str, settings: Mapping[str, Any], types: Mapping[str, Any]) -> dict[str, Any]:
    """A grid file's values checked against eval's option types (`types`: the command's type hints),
    so a wrong kind names the file and its key, not a --flag the user never typed; numbers given
    for text options become text."""
    import types as pytypes
    import typing

    out = {}
    for key, value in settings.items():
        hint = types.get(key)
        args = typing.get_args(hint) if isinstance(hint, pytypes.UnionType) else ()
        optional = type(None) in args
        base = next((a for a in args if a is not type(None)), None) if args else hint
        if value is None:
            if not optional:
                raise ConfigError(f"config: {path}: {key} needs a value ({_KINDS.get(base, 'a value')})")
        elif base in _KINDS and base is not str:
            number = isinstance(value, int | float) and not isinstance(value, bool)
            ok = {bool: isinstance(value, bool), int: number and isinstance(value, int), float: number}[base]
            if not ok:
                raise ConfigError(f"config: {path}: {key} must be {_KINDS[base]}, got {value!r}")
        elif base is str:
            if isinstance(value, bool) or not isinstance(value, str | int | float):
                raise ConfigError(f"config: {path}: {key} must be {_KINDS[str]}, got {value!r}")
            value = str(value)
        out[key] = value
    return out


def _policy_arg_items(value: Any, path: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    if isinstance(value, dict) and all(isinstance(v, dict) for v in value.values()):
        return [f"{p}.{k}={json.dumps(v)}" for p, args in value.items() for k, v in args.items()]
    raise ConfigError(
        f"config: {path}: policy_arg must be {{POLICY: {{KEY: VALUE}}}} or a list of POLICY.KEY=VALUE"
    )


def write_grid(run_dir: Path, grid: Mapping[str, Any]) -> Path:
    """The run's effective settings as a grid file beside its results (`--config` reads it back)."""
    import yaml

    settings = {k: v for k, v in grid.items() if v is not None and k not in NOT_IN_GRID}
    return atomic_write_text(run_dir / GRID_FILE, yaml.safe_dump(settings, sort_keys=False))


# ----------------------------------------------------------------------------- checks before the engine
def check_images(instances: Sequence[Instance]) -> None:
    """Every instance has its image here; one line naming the missing ones and the build command."""
    from kvagent.evals.images import image_for
    from kvagent.sandbox.docker_backend import docker_client
    from kvagent.sandbox.images import image_exists

    client = docker_client()
    missing = [i.instance_id for i in instances if not image_exists(image_for(i, client), client)]
    if missing:
        shown = ",".join(missing[:5]) + (f" (+{len(missing) - 5} more)" if len(missing) > 5 else "")
        raise KvagentError(
            f"eval: no image for {len(missing)} instance(s): {shown}; build them with "
            f"`kvagent images build --instances {','.join(missing)}`"
        )


@dataclass(frozen=True)
class EvalOptions:
    """All `kvagent eval` runs by, one object for `run_eval` and `run_eval_ray`: what runs (`sweep`),
    the engine, where episodes run, and `grid`, the command's options as given (OUT/grid.yaml).
    `ray`, `engines` and `image_registry` are --ray's (its cluster address)."""

    engine: EngineOptions
    sweep: EvalSweep
    env: str
    repos: str | None = None
    grade: bool = True
    isolation: str = "bwrap"
    network: str | None = None  # None: the scaffold's
    grid: Mapping[str, Any] | None = None
    ray: str | None = None  # an address, or auto
    engines: int | None = None
    image_registry: str | None = None


def run_eval(options: EvalOptions, console: Console | None = None) -> dict[str, Any]:
    """Plan the sweep's runs (`plan_eval`), load the engine once, run what is left here."""
    from kvagent.cli import environments
    from kvagent.evals.preflight import check_grid

    o = options
    env, repos, grade, isolation, network = o.env, o.repos, o.grade, o.isolation, o.network
    model = o.engine.model
    console = console or Console(stderr=True)
    if env not in ("docker", "local"):  # before the plan: a typo here should not cost a dataset load
        raise KvagentError(f"env: got {env!r}; choose docker or local")
    if env == "local" and not repos:
        raise KvagentError("eval: --env local needs --repos DIR holding one checkout per instance id")
    environments.check_isolation(isolation)
    environments.check_network(network, env)  # a bad value before the dataset loads
    check_engine(o.engine)
    plan = plan_eval(o.sweep, console)
    agent_cfg, selected, runs, run_dir, done, left = (
        plan.agent_config, plan.selected, plan.runs, plan.run_dir, plan.done, plan.left
    )  # fmt: skip
    network_on = environments.check_network(network, env, agent_cfg.scaffold)
    concurrency = plan.concurrency
    if env == "local":
        open_env = environments.local_env(Path(repos), isolation)
        grader = environments.local_grader(Path(repos), isolation)
        for inst in selected:
            environments.local_repo(Path(repos), inst)
    else:
        open_env = functools.partial(environments.docker_env, network=network_on)
        grader = environments.docker_grader
    if left:
        check_out_dir(run_dir)
        by_id = {i.instance_id: i for i in selected}
        if env == "docker":
            check_images([by_id[iid] for iid in dict.fromkeys(r.instance_id for r in left)])
        console.print(f"loading model {model} ...")
        # One engine; with concurrency N its forwards are shared by up to N episodes at once.
        engine = load_engine(o.engine, max_batch=concurrency)
        check_grid(engine, left, by_id, agent_cfg, sandbox_workdir(env))
        if o.grid is not None:
            write_grid(run_dir, o.grid)
        table = EvalTable(runs, done, console)
        # One episode at a time: stream it (replies, a status line per step) instead of the live table.
        from kvagent.cli.ui import EpisodeStream

        stream = EpisodeStream(console, agent_cfg.max_steps) if concurrency == 1 else None
        runner = EvalRunner(
            run_dir=run_dir,
            engine=stream.wrap(engine) if stream else engine,
            instances=by_id,
            open_env=open_env,
            agent_config=agent_cfg,
            grade=grader if grade else None,
            model_name=model,
            concurrency=concurrency,
            on_update=stream.around_runs(table, table.render) if stream else table,
            on_event=stream,  # observations and the end line of the streamed episode
        )
        try:
            with table.live if stream is None else contextlib.nullcontext():
                records = runner.run(runs)
        except KeyboardInterrupt:
            kept = sum(r.run_id in load_records(run_dir) for r in runs)
            console.print(f"{kept} of {len(runs)} runs are saved in {run_dir}; rerun the same command to "
                          "resume the rest", soft_wrap=True)  # fmt: skip
            raise
        finally:
            close = getattr(engine, "close", None)
            if close is not None:
                close()
    else:
        records = []  # every run already finished
    return finish_eval(run_dir, runs, records, console)


@dataclass
class EvalPlan:
    agent_config: Any
    selected: list[Instance]
    runs: list[EvalRun]
    run_dir: Path
    done: dict[str, dict[str, Any]]
    left: list[EvalRun]
    concurrency: int


@dataclass(frozen=True)
class EvalSweep:
    """What `kvagent eval` runs: the instances, the cache options (its lists and one value of each
    other field), the agent options, where results go and how many episodes run at once."""

    dataset: str
    split: str
    instances: str | None
    cache: CacheOptions
    agent: AgentOptions
    out: str
    concurrency: int = 1


def plan_eval(sweep: EvalSweep, console) -> EvalPlan:
    """The sweep's runs and what is left of them. Bad policy names, options, budgets or sampling fail
    here, before a model loads or a run starts (local and Ray evals alike)."""
    from kvagent.evals.datasets import load_instances
    from kvagent.evals.preflight import check_sampling

    cache, concurrency = sweep.cache, sweep.concurrency
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ConfigError(f"concurrency: must be an int >= 1 (episodes at once), got {concurrency!r}")
    names = split_list(cache.policies, "policies")
    seed_list, budget_list = parse_seeds(cache.seeds), parse_budgets(cache.budgets)
    agent_cfg = sweep.agent.config()
    args = parse_policy_args(cache.policy_arg, names)
    selected = load_instances(sweep.dataset, split=sweep.split, select=sweep.instances)
    runs = plan_runs([i.instance_id for i in selected], names, split_list(cache.modes, "modes"), budget_list,
                     seed_list, policy_args=args, **cache.fields())  # fmt: skip
    check_sampling(agent_cfg, runs)
    run_dir = Path(sweep.out)
    done = load_records(run_dir)
    left = [r for r in runs if r.run_id not in done]
    console.print(f"{len(runs)} runs planned, {len(runs) - len(left)} already finished in {run_dir}")
    return EvalPlan(agent_cfg, selected, runs, run_dir, done, left, concurrency)


def finish_eval(run_dir: Path, runs: Sequence[EvalRun], records: Sequence[dict[str, Any]], console) -> dict:
    """Write the report; infrastructure errors (recorded, not counted, redone next time) exit non-zero."""
    from kvagent.evals.report import write_report

    summary = write_report(run_dir)
    console.print(f"report: {run_dir / 'report.md'}")
    failed = [r for r in records if is_infra_error(r)]
    if failed:
        raise KvagentError(
            f"eval: {len(failed)} of {len(runs)} runs hit infrastructure errors (first: {failed[0]['run_id']}: "
            f"{failed[0].get('error')}); they are recorded, not counted, and redone when you rerun this command"
        )
    return summary
