"""Scale-out: an eval's episodes on Ray actors, one engine each, while the driver alone records.

Each actor (`EngineWorker`) builds its own `EvalRunner` on its node with `make_runner()` (a factory
from the cli layer: it loads the engine on the actor's GPU and opens sandboxes there) and runs up to
`concurrency` episodes at once (a threaded actor over one batched engine). Each run writes into a
temporary directory on the node; a call returns the run's record and those files (trajectory, grading
logs). The driver writes those files
into the run directory and hands the record to the driver's `EvalRunner`, which appends it to
runs.jsonl and rebuilds the predictions, exactly as for a local eval: one writer, so a killed eval
resumes with nothing lost or duplicated. When an actor dies, its runs go back to the queue; they are
not recorded as failures.

Ray is imported only inside `RayExecutor`, so nothing else in kvagent pulls it in.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from kvagent.errors import ConfigError, KvagentError
from kvagent.evals.runner import RUNS_FILE, EvalRun, EvalRunner
from kvagent.fileio import atomic_write_bytes
from kvagent.sandbox.owner import process_start, still_running

MakeRunner = Callable[[], EvalRunner]  # its run_dir is replaced by each run's temp dir
# on_event(event, engine index, run or None, payload): "ready" (payload: the engine's node info),
# "start", "finished" (payload: the record), "requeued", "dropped" (a run that killed its engine
# too often; left for the next invocation), "lost" (the engine died; it may restart), "dead".
OnEvent = Callable[[str, int, EvalRun | None, Any], None]
RUN_TMP_PREFIX = "kvagent-run-"  # + "<actor pid>-<its start>-": a run's files on its node until they are sent
# the actor's pid and start time (a dir of an older kvagent names only the pid)
_RUN_DIR = re.compile(rf"^{re.escape(RUN_TMP_PREFIX)}(\d+)-(?:(\d+)-)?")


class EngineWorker:
    """The body of one Ray actor: one engine, its runs' episodes. A plain class; `RayExecutor` wraps
    it with `ray.remote` (so importing this module needs no Ray)."""

    def __init__(self, make_runner: MakeRunner, preflight: Callable[[], None] | None = None) -> None:
        self._make_runner, self._preflight = make_runner, preflight
        self._runner: EvalRunner | None = None
        self._lock = threading.Lock()

    def _ensure_runner(self) -> EvalRunner:
        with self._lock:  # concurrent calls of a threaded actor: load the engine once
            if self._runner is None:
                self._runner = self._make_runner()
            return self._runner

    def ready(self) -> dict[str, Any]:
        """Check the node (images, checkouts), load the engine; where it runs."""
        import ray

        node = ray.util.get_node_ip_address()
        sweep_stale_run_dirs()  # what a killed predecessor on this node left behind
        if self._preflight is not None:
            try:
                self._preflight()
            except KvagentError as e:  # the driver's error then names the node to fix
                raise _reworded(e, f"on node {node}: {e}") from None
        self._ensure_runner()
        return {"node": node, "gpus": [str(g) for g in ray.get_gpu_ids()], "pid": os.getpid()}

    def run(self, run: EvalRun) -> tuple[dict[str, Any], dict[str, bytes]]:
        """One episode (and its grading) on this node; its record and the files it wrote."""
        runner = self._ensure_runner()
        with tempfile.TemporaryDirectory(
            prefix=f"{RUN_TMP_PREFIX}{os.getpid()}-{process_start(os.getpid()) or 0}-"
        ) as tmp:
            # Same engine and settings; only where this run's files go differs (concurrent runs).
            record = replace(runner, run_dir=Path(tmp)).run_one(run)
            return record, read_tree(Path(tmp))


def sweep_stale_run_dirs(base: str | Path | None = None) -> list[Path]:
    """Remove the run directories of actor processes that no longer exist (a killed actor cannot
    clean up after itself); returns those removed."""
    removed = []
    for path in Path(base or tempfile.gettempdir()).glob(f"{RUN_TMP_PREFIX}*-*"):
        owner = _RUN_DIR.match(path.name)
        if owner and not still_running(int(owner.group(1)), owner.group(2) or "0"):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def read_tree(root: Path) -> dict[str, bytes]:
    """Every file under `root`, by its path relative to `root`."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def write_run_files(run_dir: Path, files: Mapping[str, bytes]) -> None:
    """A run's files, from its actor, into the run directory (atomically; never outside it). The
    records and predictions are the driver's alone: an actor's copies are not taken."""
    root = Path(run_dir).resolve()
    for rel, data in files.items():
        if rel == RUNS_FILE or rel.startswith("predictions/"):
            continue
        target = (root / rel).resolve()
        if not target.is_relative_to(root):
            raise KvagentError(f"eval: an engine sent a file outside the run directory: {rel}")
        atomic_write_bytes(target, data)


class RayExecutor:
    """`EvalRunner.run(runs, execute=RayExecutor(...))`: runs the episodes on `engines` Ray actors,
    `concurrency` at a time on each, and yields (run, record) as each finishes. Ray must already be
    initialised (`ray.init`); the actors are killed when the batch ends, also on Ctrl-C.

    An actor that dies (node lost, process killed, out of memory) is restarted by Ray up to
    `max_restarts` times, reloading its engine; its runs in flight are re-queued. A run whose engine
    died under it `max_attempts` times is left unrecorded (pending for the next invocation)."""

    def __init__(
        self,
        make_runner: MakeRunner,
        *,
        run_dir: Path,
        engines: int,
        concurrency: int = 1,
        preflight: Callable[[], None] | None = None,
        gpus_per_engine: float | None = None,
        cpus_per_engine: float = 1,
        max_restarts: int = 2,
        max_attempts: int = 3,
        restart_timeout_s: float = 600,
        on_event: OnEvent | None = None,
    ) -> None:
        if engines < 1:
            raise ConfigError(f"engines: must be >= 1, got {engines}")
        if concurrency < 1:
            raise ConfigError(f"concurrency: must be >= 1, got {concurrency}")
        self.make_runner, self.preflight = make_runner, preflight
        self.run_dir, self.engines, self.concurrency = Path(run_dir), engines, concurrency
        self.gpus_per_engine, self.cpus_per_engine = gpus_per_engine, cpus_per_engine
        self.max_restarts, self.max_attempts = max_restarts, max_attempts
        self.restart_timeout_s = restart_timeout_s
        self.on_event = on_event or (lambda *_: None)
        self.dropped: list[EvalRun] = []
        self.nodes: dict[int, dict[str, Any]] = {}
        self.deaths: dict[int, str] = {}

    # ------------------------------------------------------------------------------- resources
    def _resources(self, ray: Any, engines: int) -> dict[str, float]:
        """Per-actor resources: one GPU each when the cluster has GPUs, else CPUs; checked against the
        cluster, so a request that could never be placed fails now instead of waiting forever."""
        total = ray.cluster_resources()
        gpus = self.gpus_per_engine
        if gpus is None:
            gpus = 1.0 if total.get("GPU", 0) >= 1 else 0.0
        need = {"num_gpus": gpus, "num_cpus": self.cpus_per_engine}
        have_gpu, have_cpu = total.get("GPU", 0), total.get("CPU", 0)
        if gpus and engines * gpus > have_gpu:
            raise ConfigError(f"--engines {engines} needs {engines * gpus:g} GPUs; the Ray "
                              f"cluster has {have_gpu:g}: lower --engines or add nodes (ray start --address)")  # fmt: skip
        if engines * self.cpus_per_engine > have_cpu:
            raise ConfigError(f"--engines {engines} needs {engines * self.cpus_per_engine:g} CPUs; "
                              f"the Ray cluster has {have_cpu:g}: lower --engines or add nodes")  # fmt: skip
        return need

    # ------------------------------------------------------------------------------- the loop
    def __call__(self, runs: list[EvalRun]) -> Iterator[tuple[EvalRun, dict[str, Any]]]:
        if not runs:
            return
        import ray
        from ray.exceptions import ActorUnavailableError, RayActorError, RayTaskError

        n = min(self.engines, len(runs))  # no engine loaded for nothing
        opts = self._resources(ray, n)
        cls = ray.remote(EngineWorker).options(
            max_concurrency=self.concurrency, max_restarts=self.max_restarts, **opts
        )
        actors = {i: cls.remote(self.make_runner, self.preflight) for i in range(n)}
        queue: deque[EvalRun] = deque(runs)
        attempts: Counter[str] = Counter()
        waking: dict[Any, int] = {actors[i].ready.remote(): i for i in actors}  # ready() in flight
        working: set[int] = set()  # engines that answered ready() and take runs
        retry_at: dict[int, float] = {}  # engines Ray is restarting: ask ready() again at that time
        unavailable_since: dict[int, float] = {}
        inflight: dict[Any, tuple[int, EvalRun]] = {}
        load: Counter[int] = Counter()
        try:
            while queue or inflight:
                now = time.monotonic()
                for i in [i for i, t in retry_at.items() if t <= now]:
                    del retry_at[i]
                    waking[actors[i].ready.remote()] = i
                for i in sorted(working):
                    while queue and load[i] < self.concurrency:
                        run = queue.popleft()
                        inflight[actors[i].run.remote(run)] = (i, run)
                        load[i] += 1
                        self.on_event("start", i, run, None)
                if not inflight and not waking and not retry_at:
                    last = next(reversed(self.deaths.values()), "unknown")
                    raise KvagentError(f"eval: every engine died (last: {last}); {len(queue)} run(s) left "
                                       "unrecorded: rerun the command to resume; Ray's logs are under "
                                       "/tmp/ray/session_latest/logs")  # fmt: skip
                refs = [*inflight, *waking]
                ready, _ = ray.wait(refs, num_returns=1, timeout=1.0) if refs else ([], time.sleep(0.5))
                for ref in ready:
                    if ref in waking:
                        i = waking.pop(ref)
                        try:
                            self.nodes[i] = ray.get(ref)
                        except ActorUnavailableError as e:  # restarting: its process or engine is loading
                            since = unavailable_since.setdefault(i, time.monotonic())
                            if time.monotonic() - since < self.restart_timeout_s:
                                retry_at[i] = time.monotonic() + 1.0
                                continue
                            self.deaths[i] = _first_line(e)
                            self.on_event("dead", i, None, self.deaths[i])
                            continue
                        except RayActorError as e:
                            self.deaths[i] = _first_line(e)
                            self.on_event("dead", i, None, self.deaths[i])  # restarts used up
                            continue
                        except RayTaskError as e:
                            raise _engine_error(i, self.nodes.get(i), e) from None
                        unavailable_since.pop(i, None)
                        working.add(i)
                        self.on_event("ready", i, None, self.nodes[i])
                        continue
                    i, run = inflight.pop(ref)
                    load[i] -= 1
                    try:
                        record, files = ray.get(ref)
                    except RayActorError:
                        self._requeue(run, i, queue, attempts)
                        if i in working:  # wait for Ray's restart (or its verdict) before new runs
                            working.discard(i)
                            self.on_event("lost", i, None, None)
                            waking[actors[i].ready.remote()] = i
                        continue
                    except RayTaskError as e:
                        raise _engine_error(i, self.nodes.get(i), e) from None
                    write_run_files(self.run_dir, files)  # before the record that points at them
                    self.on_event("finished", i, run, record)
                    yield run, record
        finally:
            for actor in actors.values():
                ray.kill(actor, no_restart=True)

    def _requeue(self, run: EvalRun, engine: int, queue: deque[EvalRun], attempts: Counter[str]) -> None:
        attempts[run.run_id] += 1
        if attempts[run.run_id] >= self.max_attempts:
            self.dropped.append(run)
            self.on_event("dropped", engine, run, None)
        else:
            queue.appendleft(run)
            self.on_event("requeued", engine, run, None)


def _first_line(err: BaseException) -> str:
    lines = [x.strip() for x in str(err).splitlines() if x.strip()]
    return lines[0][:300] if lines else type(err).__name__


def _engine_error(index: int, node: Mapping[str, Any] | None, err: Any) -> BaseException:
    """An actor's exception, raised on the driver: kvagent's own errors as one line naming the engine
    and node; anything else as itself (a bug, with the actor's traceback)."""
    cause = getattr(err, "cause", None)
    if isinstance(cause, KvagentError):
        if str(cause).startswith("on node "):
            return _reworded(cause, f"engine {index} {cause}")
        where = f"engine {index}" + (f" on node {node['node']}" if node else "")
        return _reworded(cause, f"{where}: {cause}")
    return cause if isinstance(cause, BaseException) else err


def _reworded(err: KvagentError, message: str) -> KvagentError:
    try:
        return type(err)(message)
    except TypeError:  # a subclass with other arguments
        return KvagentError(message)
