"""Where episodes run and are graded: the sandbox openers and graders that `kvagent eval`,
`kvagent grade` and recipe checks hand to the evals layer, and where the bench commands' generated
episodes run their tool calls (`local_sandbox`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvagent.errors import ConfigError, KvagentError
from kvagent.evals.datasets import Instance

GRADE_LIMITS = {"mem_limit": "4g", "pids_limit": 4096}
# --isolation: how a local sandbox runs model-written commands. Unisolated only when asked for.
ISOLATIONS = ("bwrap", "none")
# --network: a docker sandbox's network. R2E-Gym's containers have Docker's default one (docs/deepswe.md).
NETWORKS = ("none", "default")
# --network left out: the scaffold's. R2E-Gym's protocol runs with the network; kvagent's keeps
# model-written commands off it unless asked.
NETWORK_BY_SCAFFOLD = {"kvagent": "none", "r2egym": "default"}


def local_sandbox(repo: Path) -> Any:
    """How generated episodes run their tool calls (bench fidelity, study, speed): a local sandbox
    over a copy of `repo`."""
    from kvagent.sandbox import open_sandbox

    return open_sandbox("local", repo=repo)


def check_isolation(isolation: str) -> str:
    """Validate --isolation before anything slow happens."""
    if isolation not in ISOLATIONS:
        raise ConfigError(
            f"isolation: got {isolation!r}; use bwrap (the default) or none (commands run on the host)"
        )
    return isolation


def with_isolation(spec: dict[str, Any], isolation: str) -> dict[str, Any]:
    """A sandbox spec (`solve.sandbox_spec`) with --isolation applied: local sandboxes only; a
    container is isolated by Docker whatever the option says."""
    check_isolation(isolation)
    return {**spec, "isolation": isolation} if spec.get("backend") == "local" else spec


def check_network(network: str | None, backend: str, scaffold: str = "kvagent") -> bool:
    """--network, checked before anything slow: True for Docker's default network. Left out (None):
    the scaffold's (NETWORK_BY_SCAFFOLD). Only docker sandboxes have one: `default` given for
    another is refused, the scaffold's is not applied (a local sandbox's network stays unshared)."""
    if network is None:
        return backend == "docker" and NETWORK_BY_SCAFFOLD.get(scaffold) == "default"
    if network not in NETWORKS:
        raise ConfigError(
            f"network: got {network!r}; use none or default (Docker's network, as R2E-Gym's); left out, "
            "the scaffold's (default under --scaffold r2egym)"
        )
    if network == "default" and backend != "docker":
        raise ConfigError(
            "network: --network default is for docker sandboxes (--image, --env docker); drop it"
        )
    return network == "default"


def with_network(spec: dict[str, Any], network: str | None, scaffold: str = "kvagent") -> dict[str, Any]:
    """A sandbox spec (`solve.sandbox_spec`) with --network (or the scaffold's) applied."""
    return {**spec, "network": True} if check_network(network, spec.get("backend", ""), scaffold) else spec


def docker_env(instance: Instance, network: bool = False) -> Any:
    """The instance's image (a locally built kvagent image, else the official one)."""
    from kvagent.evals.images import image_for
    from kvagent.sandbox import open_sandbox

    return open_sandbox("docker", image=image_for(instance), network=network)


def grading_sandbox(instance: Instance, image: str | None = None, client: Any = None) -> Any:
    """A fresh container of the instance's image (or `image`) to grade in; a missing image is a
    one-line error saying how to build it."""
    from kvagent.evals.images import image_for, instance_image_tag
    from kvagent.sandbox import open_sandbox
    from kvagent.sandbox.images import image_exists

    iid = instance.instance_id
    image = image or image_for(instance, client)
    if not image_exists(image, client):
        if image == instance_image_tag(iid):
            raise KvagentError(
                f"image {image} not found; build it with `kvagent images build --instances {iid}`"
            )
        raise KvagentError(
            f"image {image} is not available offline; build {instance_image_tag(iid)} "
            f"with `kvagent images build --instances {iid}`"
        )
    labels = {"kvagent.role": "grade", "kvagent.instance_id": iid}
    return open_sandbox("docker", image=image, labels=labels, client=client, **GRADE_LIMITS)


def docker_grader(instance: Instance, patch: str, log_dir: Path) -> dict[str, Any]:
    from kvagent.evals.grading import grade_instance

    return grade_instance(instance, patch, open_env=grading_sandbox, log_dir=log_dir)


def check_sandbox(tag: str) -> Any:
    """A fresh container of a just-built image, for `kvagent.evals.check`."""
    from kvagent.sandbox import open_sandbox

    return open_sandbox("docker", image=tag, labels={"kvagent.role": "check"})


def scripted_sandbox(repo: Path) -> Any:
    """A local sandbox for calls the project scripts itself (a generated episode's, fixed in code),
    never a model's: bwrap where the machine allows it, else unisolated (`sb.unisolated_why`)."""
    from kvagent.sandbox import open_sandbox

    return open_sandbox("local", repo=repo, isolation="scripted")


def sandbox_line(sb: Any, whose: str) -> str:
    """One line saying how a scripted sandbox runs `whose` calls, e.g. `sandbox: bwrap`."""
    if sb.bwrap is None:
        return f"sandbox: unisolated ({sb.unisolated_why}; {whose} calls are scripted)"
    if sb.uid is None:
        return "sandbox: bwrap without a user namespace (commands run as the invoking user)"
    return "sandbox: bwrap"


def local_repo(repos: Path, instance: Instance) -> Path:
    """`repos/<instance_id>`: a checkout at the instance's base commit."""
    path = Path(repos) / instance.instance_id
    if not path.is_dir():
        raise KvagentError(
            f"no checkout for {instance.instance_id} at {path}; clone it there at {instance.base_commit[:12]}"
        )
    return path


def local_env(repos: Path, isolation: str = "bwrap") -> Callable[[Instance], Any]:
    from kvagent.sandbox import open_sandbox

    check_isolation(isolation)
    return lambda instance: open_sandbox("local", repo=local_repo(repos, instance), isolation=isolation)


def local_grader(repos: Path, isolation: str = "bwrap") -> Callable[[Instance, str, Path], dict[str, Any]]:
    """Grading runs the model's patch and the tests, so it is isolated the same way."""
    from kvagent.evals.grading import grade_instance

    def grade(instance: Instance, patch: str, log_dir: Path) -> dict[str, Any]:
        return grade_instance(instance, patch, open_env=local_env(repos, isolation), log_dir=log_dir)

    return grade
