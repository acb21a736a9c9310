"""`kvagent grade --harness official`: hand the predictions to swebench's own harness (it pulls the
official images, so it needs Docker Hub)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kvagent.errors import KvagentError
from kvagent.evals.datasets import load_instances, select_instances
from kvagent.evals.grading import DEFAULT_TIMEOUT_S
from kvagent.sandbox.docker_backend import docker_client


def official_harness_command(
    predictions: str,
    dataset: str,
    instance_ids: Sequence[str] | None,
    out_dir: str | Path,
    *,
    split: str = "test",
    timeout: int = DEFAULT_TIMEOUT_S,
    run_id: str = "kvagent",
    workers: int = 1,
) -> list[str]:
    """The swebench harness invocation for a predictions file (it pulls the official images)."""
    import sys

    cmd = [
        sys.executable, "-m", "swebench.harness.run_evaluation",
        "--dataset_name", str(dataset),
        "--split", split,
        "--predictions_path", str(predictions),
        "--run_id", run_id,
        "--timeout", str(timeout),
        "--max_workers", str(workers),
        "--report_dir", str(out_dir),
    ]  # fmt: skip
    if instance_ids:
        cmd += ["--instance_ids", *instance_ids]
    return cmd


def run_official_harness(
    predictions: str,
    dataset: str,
    instances: str | Sequence[str] | None,
    out_dir: str | Path,
    *,
    split: str = "test",
    timeout: int = DEFAULT_TIMEOUT_S,
) -> int:
    """Hand the predictions to swebench's own harness (needs Docker Hub for its images)."""
    import subprocess

    if predictions != "gold" and not Path(predictions).is_file():
        raise KvagentError(f"predictions file {predictions} not found; pass a JSONL/JSON file or `gold`")
    ids = None
    if instances is not None:
        ids = [i.instance_id for i in select_instances(load_instances(dataset, split=split), instances)]
    docker_client()  # a clear error now rather than a traceback from inside the harness
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    cmd = official_harness_command(predictions, dataset, ids, out_dir, split=split, timeout=timeout)
    return subprocess.run(cmd, cwd=out_dir).returncode
