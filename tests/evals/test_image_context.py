"""The wheelhouse of an instance image: a pin with no wheel for the image's Python (sympy-20442's
mpmath==1.1.0 ships only an sdist) takes its sdist, from any host, and the rest is still resolved
as wheels; any other failure is left as it was (one line naming it). pip is played by a fake."""

from __future__ import annotations

import pytest

from kvagent.errors import KvagentError
from kvagent.evals import image_context


@pytest.fixture
def pip(monkeypatch):
    """A fake `_run`: wheel downloads fail for the pins in `no_wheel` as pip does (its last line);
    an sdist download writes the file. Records each command."""
    state = {"calls": [], "no_wheel": {"mpmath==1.1.0"}, "no_sdist": set()}

    def run(cmd, what, cwd=None):
        state["calls"].append(list(cmd))
        dest = image_context.Path(cmd[cmd.index("-d") + 1])
        if "--no-binary" in cmd:
            pin = cmd[-1]
            if pin in state["no_sdist"]:
                raise KvagentError(f"{what} failed: ERROR: No matching distribution found for {pin}")
            name, version = pin.split("==")
            (dest / f"{name}-{version}.tar.gz").write_bytes(b"")
            return ""
        for pin in [*cmd, *state.get("dependencies", [])]:  # a pin's dependencies are resolved too
            if pin in state["no_wheel"]:
                raise KvagentError(f"{what} failed: ERROR: No matching distribution found for {pin}")
        return ""

    monkeypatch.setattr(image_context, "_run", run)
    return state


def test_a_pin_without_a_wheel_takes_its_sdist(pip, tmp_path):
    image_context.download_wheels(["mpmath==1.1.0", "six==1.16.0"], tmp_path, python="3.9", glibc="2_31")
    sdist = [c for c in pip["calls"] if "--no-binary" in c]
    assert len(sdist) == 1 and sdist[0][-2:] == ["--no-deps", "mpmath==1.1.0"]
    last = pip["calls"][-1]
    assert "--only-binary" in last and "six==1.16.0" in last and "mpmath==1.1.0" not in last
    assert (tmp_path / "mpmath-1.1.0.tar.gz").exists()


def test_a_missing_dependency_or_sdist_is_still_one_line(pip, tmp_path):
    pip["no_wheel"], pip["dependencies"] = {"markupsafe<2.1"}, ["markupsafe<2.1"]
    with pytest.raises(KvagentError) as e:  # a dependency, not a pin: no sdist is guessed for it
        image_context.download_wheels(["jinja2==3.0.0"], tmp_path, python="3.8")
    assert "markupsafe<2.1" in str(e.value) and not [c for c in pip["calls"] if "--no-binary" in c]
    pip["no_wheel"], pip["no_sdist"], pip["dependencies"] = {"nopkg==9.9"}, {"nopkg==9.9"}, []
    with pytest.raises(KvagentError) as e:
        image_context.download_wheels(["nopkg==9.9"], tmp_path, python="3.8")
    msg = str(e.value)
    assert "\n" not in msg and "sdist of nopkg==9.9" in msg and "no wheel for Python 3.8" in msg
