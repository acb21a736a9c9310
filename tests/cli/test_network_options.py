"""--network (issue #46): left out, the scaffold's: a docker sandbox under --scaffold r2egym has
Docker's network (R2E-Gym runs with one), under kvagent's none; `--network none` or `default` says
so for either; a local sandbox never gets one. `eval --ray` hands the choice to its actors. The
options are built as far as the sandbox spec or the actors' setup; no model, Docker or Ray runs."""

from __future__ import annotations

import pytest

from kvagent.cli.app import app
from kvagent.cli.exits import run_app
from kvagent.cli.settings import EngineOptions
from tests.cli.test_engine_options import ray_setup


class Spec(Exception):
    def __init__(self, spec):
        super().__init__("spec")
        self.spec = spec


@pytest.fixture()
def spec_of(monkeypatch):
    """solve's sandbox spec, caught where it is checked (before the model loads)."""
    import kvagent.cli.solve as solve

    def caught(spec):
        raise Spec(spec)

    monkeypatch.setattr(solve, "check_image", caught)


CASES = [  # extra options, whether the docker sandbox has a network
    ([], False),
    (["--scaffold", "r2egym"], True),
    (["--scaffold", "r2egym", "--network", "none"], False),
    (["--network", "default"], True),
    (["--scaffold", "kvagent", "--network", "none"], False),
]


@pytest.mark.parametrize("extra, on", CASES)
def test_solve_in_an_image_has_the_network_of_its_scaffold_or_option(extra, on, spec_of, tmp_path):
    with pytest.raises(Spec) as got:
        run_app(app, ["solve", "--image", "img", "--issue", "x", "--out", str(tmp_path / "o"), *extra])
    assert got.value.spec["backend"] == "docker" and got.value.spec.get("network", False) is on


def test_a_local_sandbox_under_r2egym_stays_off_the_network(spec_of, tmp_path):
    with pytest.raises(Spec) as got:
        run_app(app, ["solve", "--repo", str(tmp_path), "--issue", "x", "--isolation", "none",
                      "--out", str(tmp_path / "o"), "--scaffold", "r2egym"])  # fmt: skip
    assert got.value.spec["backend"] == "local" and "network" not in got.value.spec


@pytest.mark.parametrize("extra, on", CASES)
def test_eval_ray_hands_its_actors_the_network(extra, on, monkeypatch, mini, tmp_path):
    got = ray_setup(monkeypatch, mini, tmp_path, *extra, env="docker")
    assert got.kwargs["network"] is on


def test_eval_ray_with_local_checkouts_has_no_network(monkeypatch, mini, tmp_path):
    assert ray_setup(monkeypatch, mini, tmp_path, "--scaffold", "r2egym").kwargs["network"] is False


@pytest.mark.parametrize(
    "env, value, words",
    [
        ("local", "default", "network: --network default is for docker sandboxes"),
        ("docker", "host", "got 'host'"),
    ],
)
def test_eval_ray_refuses_a_network_its_sandboxes_cannot_have_in_one_line(
    env, value, words, mini, tmp_path, capsys
):
    dataset, repos = mini
    code = run_app(app, ["eval", "--dataset", str(dataset), "--env", env, "--repos", str(repos), "--out",
                         str(tmp_path / "o"), "--ray", "auto", "--network", value])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and words in err[0], err


def test_the_actor_opens_docker_sandboxes_with_the_network(monkeypatch):
    from kvagent.cli import environments
    from kvagent.cli.eval.ray import EngineSetup
    from kvagent.runtime import Engine

    opened = []
    monkeypatch.setattr(environments, "docker_env", lambda instance, network=False: opened.append(network))

    class Built(Exception):
        pass

    def runner(**kwargs):
        kwargs["open_env"]("instance")
        raise Built

    monkeypatch.setattr(Engine, "load", lambda *a, **k: object())
    monkeypatch.setattr("kvagent.evals.preflight.check_grid", lambda *a: None)
    monkeypatch.setattr("kvagent.cli.eval.ray.EvalRunner", runner)
    for network in (True, False):
        with pytest.raises(Built):
            EngineSetup(EngineOptions(model="m"), {}, "docker", network=network)()
    assert opened == [True, False]
