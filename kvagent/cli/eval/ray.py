"""`kvagent eval --ray ADDRESS --engines N`: the same sweep as `kvagent eval`, its episodes on N Ray
actors (one engine on one GPU each), recorded by this process into the same resumable run directory."""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from kvagent.agent.config import AgentConfig
from kvagent.cli.settings import EngineOptions
from kvagent.errors import ConfigError, KvagentError
from kvagent.evals.datasets import Instance
from kvagent.evals.runner import EvalRun, EvalRunner

if TYPE_CHECKING:  # the workers never import the command's planning
    from kvagent.cli.eval.run import EvalOptions


@dataclass
class EngineSetup:
    """What an actor builds on its own node (pickled to it): the engine, its sandboxes, the grader."""

    engine: EngineOptions  # its decode step checked against the actor's own device as it loads
    instances: Mapping[str, Instance]
    env: str  # docker | local
    repos: str | None = None
    grade: bool = True
    agent_config: AgentConfig = field(default_factory=AgentConfig)
    concurrency: int = 1
    check: Sequence[EvalRun] = ()  # runs whose settings are checked on the loaded engine
    network: bool = False  # docker episodes on Docker's default network (--network, or the scaffold's)

    def __call__(self) -> EvalRunner:
        from kvagent.cli import environments
        from kvagent.cli.common import sandbox_workdir
        from kvagent.evals.preflight import check_grid
        from kvagent.runtime import Engine

        if self.env == "local":
            repos = Path(self.repos or "")
            open_env, grader = environments.local_env(repos), environments.local_grader(repos)
        else:
            open_env = functools.partial(environments.docker_env, network=self.network)
            grader = environments.docker_grader
        # Ray sets the actor's CUDA_VISIBLE_DEVICES (its GPU) and OMP threads (its CPUs).
        e = self.engine
        engine = Engine.load(e.model, device=e.device, dtype=e.dtype, max_batch=self.concurrency,
                             decode_step=e.decode_step, linear=e.linear)  # fmt: skip
        # As `kvagent eval` does, before the first run: budgets against prompts, the model's context.
        check_grid(engine, self.check, self.instances, self.agent_config, sandbox_workdir(self.env))
        return EvalRunner(
            run_dir=Path("."), engine=engine, instances=self.instances, open_env=open_env,
            agent_config=self.agent_config, grade=grader if self.grade else None, model_name=self.engine.model,
        )  # fmt: skip


@dataclass
class NodeCheck:
    """Run on each actor's node before its engine loads: the instances' checkouts (local) or images
    (docker) are there, pulled from `registry` first if one is named."""

    instances: Sequence[Instance]
    env: str
    repos: str | None = None
    registry: str | None = None

    def __call__(self) -> None:
        from kvagent.cli import environments

        if self.env == "local":
            for inst in self.instances:
                environments.local_repo(Path(self.repos or ""), inst)
            return
        from kvagent.cli.eval.run import check_images
        from kvagent.evals.images import instance_image_tag
        from kvagent.sandbox.images import image_exists

        if self.registry:
            for inst in self.instances:
                if not image_exists(instance_image_tag(inst.instance_id)):
                    pull_image(self.registry, instance_image_tag(inst.instance_id))
        try:
            check_images(self.instances)
        except KvagentError as e:
            how = (
                f"push them to {self.registry}" if self.registry else "name a registry with --image-registry"
            )
            raise KvagentError(f"{e} on every node that runs engines, or {how} (docs/scale.md)") from None


def pull_image(registry: str, tag: str) -> None:
    """`docker pull REGISTRY/TAG` and tag it TAG; a missing image is left for the check to report."""
    import docker.errors

    from kvagent.sandbox.docker_backend import docker_client

    client = docker_client()
    remote = f"{registry.rstrip('/')}/{tag}"
    name, _, version = remote.rpartition(":")
    with contextlib.suppress(docker.errors.APIError):
        client.images.pull(name, tag=version).tag(*tag.rsplit(":", 1))


class EngineTable:
    """Live view: per configuration done / running / resolved, and per engine its node, state and runs."""

    def __init__(self, runs: Sequence[EvalRun], done: Mapping[str, Any], engines: int) -> None:
        self.configs = list(dict.fromkeys(r.label for r in runs))
        self.total = Counter(r.label for r in runs)
        self.done = Counter(r.label for r in runs if r.run_id in done)
        self.resolved = Counter(r.label for r in runs if done.get(r.run_id, {}).get("resolved"))
        self.running: dict[str, int] = dict.fromkeys(self.configs, 0)
        self.engines = {i: {"node": "-", "state": "starting", "running": 0, "done": 0, "requeued": 0}
                        for i in range(engines)}  # fmt: skip
        self.started, self.finished_here = time.time(), 0
        self.lock = threading.Lock()
        self.live: Live | None = None

    def render(self) -> Group:
        runs = Table(title="kvagent eval (Ray)")
        for col in ("configuration", "done", "running", "resolved"):
            runs.add_column(col, justify="left" if col == "configuration" else "right")
        for c in self.configs:
            runs.add_row(c, f"{self.done[c]}/{self.total[c]}", str(self.running[c]), str(self.resolved[c]))
        left = sum(self.total.values()) - sum(self.done.values())
        eta = ""
        if self.finished_here:
            eta = f", ETA {(time.time() - self.started) / self.finished_here * left / 60:.1f} min"
        runs.caption = f"{left} runs left{eta}"
        engines = Table(title="engines")
        for col in ("engine", "node", "gpu", "state", "running", "done", "requeued"):
            engines.add_column(col, justify="right" if col in ("running", "done", "requeued") else "left")
        for i, e in self.engines.items():
            engines.add_row(str(i), e["node"], e.get("gpu", "-"), e["state"], str(e["running"]),
                            str(e["done"]), str(e["requeued"]))  # fmt: skip
        return Group(runs, engines)

    def on_event(self, event: str, engine: int, run: EvalRun | None, payload: Any) -> None:
        with self.lock:
            e = self.engines[engine]
            if event == "ready":
                e.update(node=payload["node"], gpu=",".join(payload["gpus"]) or "cpu", state="running")
            elif event in ("lost", "dead"):
                e["state"] = "restarting" if event == "lost" else "dead"
            elif event == "start" and run is not None:
                e["running"] += 1
                self.running[run.label] += 1
            elif event in ("finished", "requeued", "dropped") and run is not None:
                e["running"] -= 1
                self.running[run.label] -= 1
                e["done" if event == "finished" else "requeued"] += 1
            self._refresh()

    def on_record(self, event: str, run: EvalRun, record: Mapping[str, Any] | None) -> None:
        """The driver runner's callback: a record was appended (run here or derived)."""
        with self.lock:
            if event == "done":
                self.done[run.label] += 1
                self.finished_here += 1
                self.resolved[run.label] += bool(record and record.get("resolved"))
            self._refresh()

    def _refresh(self) -> None:
        if self.live is not None:
            self.live.update(self.render())


def init_ray(address: str) -> tuple[Any, bool]:
    """Ray connected to the cluster at `address` (`auto`: the one `ray start` runs on this machine,
    else a new one-node cluster here), and whether this call connected it (so should disconnect). A
    process already connected (a notebook, a test) keeps its connection."""
    try:
        import ray
    except ImportError:
        raise ConfigError("--ray needs Ray: pip install 'kvagent[ray]'") from None
    import logging

    if ray.is_initialized():
        return ray, False
    # log_to_driver off: the actors' output would tear the live table; it stays in Ray's log files.
    ray.init(address=None if address == "auto" else address, log_to_driver=False,
             logging_level=logging.WARNING, include_dashboard=False)  # fmt: skip
    return ray, True


def run_eval_ray(options: EvalOptions, console: Console | None = None) -> dict[str, Any]:
    """`kvagent eval`'s planning, checks, records and report (kvagent.cli.eval.run), its episodes on Ray
    (`options.ray`: the cluster's address, `options.engines` actors)."""
    from kvagent.cli import environments
    from kvagent.cli.common import check_out_dir
    from kvagent.cli.eval.run import finish_eval, plan_eval, write_grid
    from kvagent.evals.distributed import RayExecutor

    o = options
    engines, env, repos, network, model = o.engines, o.env, o.repos, o.network, o.engine.model
    console = console or Console(stderr=True)
    if engines is not None and engines < 1:
        raise ConfigError(f"--engines: must be >= 1, got {engines}")
    if env not in ("docker", "local"):
        raise ConfigError(f"env: got {env!r}; choose docker or local")
    if env == "local" and not repos:
        raise ConfigError("eval: --env local needs --repos DIR holding one checkout per instance id")
    environments.check_network(network, env)  # a bad value before the dataset loads
    plan = plan_eval(o.sweep, console)
    agent_cfg, selected, runs, run_dir, done, left = (
        plan.agent_config, plan.selected, plan.runs, plan.run_dir, plan.done, plan.left
    )  # fmt: skip
    concurrency = plan.concurrency
    network_on = environments.check_network(network, env, agent_cfg.scaffold)
    records: list[dict[str, Any]] = []
    if left:
        check_out_dir(run_dir)  # a file in the way fails before Ray starts
        by_id = {i.instance_id: i for i in selected}
        ray, connected = init_ray(o.ray)
        try:
            gpus = int(ray.cluster_resources().get("GPU", 0))
            n = engines or max(1, gpus)
            console.print(
                f"Ray: {n} engine(s) of {model} on {gpus or 'no'} GPU(s), {concurrency} episode(s) each"
            )
            setup = EngineSetup(o.engine, by_id, env, repos, o.grade, agent_cfg, concurrency, left,
                                network=network_on)  # fmt: skip
            needed = [by_id[iid] for iid in dict.fromkeys(r.instance_id for r in left)]
            table = EngineTable(runs, done, min(n, len(left)))
            executor = RayExecutor(setup, run_dir=run_dir, engines=n, concurrency=concurrency,
                                   preflight=NodeCheck(needed, env, repos, o.image_registry),
                                   on_event=table.on_event)  # fmt: skip
            runner = EvalRunner(run_dir=run_dir, engine=None, instances=by_id, open_env=None,
                                agent_config=agent_cfg, model_name=model, on_update=table.on_record)  # fmt: skip
            if o.grid is not None:
                write_grid(run_dir, o.grid)
            with Live(table.render(), console=console, refresh_per_second=2) as live:
                table.live = live
                records = runner.run(runs, execute=executor)
            if not console.is_terminal:  # the last table printed without its line end
                console.line()
            if executor.dropped:
                console.print(f"{len(executor.dropped)} run(s) killed their engine {executor.max_attempts} "
                              "times and are left unrecorded; rerun to retry them")  # fmt: skip
        finally:
            if connected:
                ray.shutdown()
    return finish_eval(run_dir, runs, records, console)
