"""Docker sandboxes as R2E-Gym's: in an image with the task's interpreter at /root/.venv/bin/python,
the r2egym tools run under it (R2E-Gym's tools have `#!/root/.venv/bin/python`), kvagent's own tools
under the image's python3; `network=True` (`--network default`) is Docker's default bridge network,
as R2E-Gym leaves it, and none stays the default."""

from __future__ import annotations

import io
import uuid
import zipfile

import pytest

from kvagent.sandbox import open_sandbox

pytestmark = pytest.mark.slow

# A stand-in task interpreter that logs its arguments, then runs python3.
DOCKERFILE = """FROM {base}
RUN mkdir -p /root/.venv/bin && printf '#!/bin/sh\\necho "$@" >> /var/tmp/task-python.log\\nexec python3 "$@"\\n' \
    > /root/.venv/bin/python && chmod +x /root/.venv/bin/python
"""


@pytest.fixture(scope="module")
def venv_image(base_image):
    from kvagent.sandbox.docker_backend import docker_client

    client = docker_client()
    tag = f"kvagent/test-task-python:{uuid.uuid4().hex[:8]}"
    dockerfile = io.BytesIO(DOCKERFILE.format(base=base_image).encode())
    client.images.build(fileobj=dockerfile, tag=tag, rm=True, network_mode="none")
    yield tag
    client.images.remove(tag, force=True)


def test_r2egym_tools_run_under_the_task_interpreter(venv_image, repo, test_label):
    with open_sandbox("docker", image=venv_image, repo=repo, labels=test_label) as sb:
        assert sb.task_python == "/root/.venv/bin/python"
        r2e = sb.run_tool("r2egym/execute_bash", {"cmd": "echo hi"})
        own = sb.run_tool("execute_bash", {"cmd": "echo hi"})
        log = sb.run("cat /var/tmp/task-python.log", timeout=30).output
    assert "hi" in r2e.output and "hi" in own.output
    assert "/kvagent/tools/r2egym/execute_bash.py" in log
    assert "/kvagent/tools/execute_bash.py" not in log


def test_without_a_task_interpreter_the_image_python_runs_them(base_image, repo, test_label):
    with open_sandbox("docker", image=base_image, repo=repo, labels=test_label) as sb:
        assert sb.task_python is None
        assert "[STDOUT]\n\nhi" in sb.run_tool("r2egym/execute_bash", {"cmd": "echo hi"}).output


@pytest.mark.parametrize(("network", "mode"), [(False, "none"), (True, "bridge")])
def test_network_modes(base_image, repo, test_label, network, mode):
    from kvagent.sandbox.docker_backend import docker_client

    with open_sandbox("docker", image=base_image, repo=repo, labels=test_label, network=network) as sb:
        assert docker_client().api.inspect_container(sb.container.id)["HostConfig"]["NetworkMode"] == mode


CONDA_DOCKERFILE = """FROM {base}
RUN mkdir -p /opt/miniconda3/envs/testbed/bin && ln -s /usr/bin/python3 /opt/miniconda3/envs/testbed/bin/python
"""


def test_a_swebench_style_testbed_env_is_linked_to_root_venv_as_r2egym_does(base_image, repo, test_label):
    """SWE-bench images keep the task env at /opt/miniconda3/envs/testbed: R2E-Gym links it to
    /root/.venv (where its tools' `#!` points); the r2egym scaffold does so before the first call."""
    from kvagent.sandbox.docker_backend import docker_client

    client = docker_client()
    tag = f"kvagent/test-conda-testbed:{uuid.uuid4().hex[:8]}"
    client.images.build(
        fileobj=io.BytesIO(CONDA_DOCKERFILE.format(base=base_image).encode()),
        tag=tag,
        rm=True,
        network_mode="none",
    )
    try:
        with open_sandbox("docker", image=tag, repo=repo, labels=test_label) as sb:
            assert sb.task_python is None
            sb.link_task_venv()
            assert sb.task_python == "/root/.venv/bin/python"
            assert sb.run("readlink /root/.venv", timeout=30).output.strip() == "/opt/miniconda3/envs/testbed"
            sb.link_task_venv()  # a second time changes nothing
            assert sb.run("readlink /root/.venv", timeout=30).output.strip() == "/opt/miniconda3/envs/testbed"
    finally:
        client.images.remove(tag, force=True)


def _wheel(version: str) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("fakemod/__init__.py", f"VERSION = {version!r}\n")
        z.writestr(f"fakemod-{version}.dist-info/METADATA", f"Name: fakemod\nVersion: {version}\n")
    return buf.getvalue()


def test_a_module_the_task_env_lacks_is_unpacked_from_the_wheel_for_its_python(venv_image, repo, test_label):
    """R2E-Gym's `python -m pip install chardet` on SWE-bench images, offline: the wheel chosen by
    the task interpreter's version (3.11 here: the 3.7+ one), once; an importable module is left."""
    wheels = {"3.6": _wheel("5.0.0"), "3.7": _wheel("5.2.0"), "3.99": _wheel("9")}
    with open_sandbox("docker", image=venv_image, repo=repo, labels=test_label) as sb:
        assert sb.provide_module("fakemod", wheels) == "3.11"
        r = sb.run("/root/.venv/bin/python -c 'import fakemod; print(fakemod.VERSION)'", timeout=30)
        assert r.output.strip() == "5.2.0"
        assert sb.provide_module("fakemod", wheels) is None  # importable now: nothing done
