"""The engine options (--model, --device, --dtype, --decode-step; cli/settings.py's ENGINE) reach
the engine of every command that loads one, and a decode step the device cannot run stops before the
model is read. `Engine.load` is replaced by a recorder, so no model loads."""

from __future__ import annotations

import pytest

from kvagent.cli.app import app
from kvagent.cli.exits import run_app
from kvagent.cli.settings import EngineOptions
from kvagent.errors import ConfigError
from kvagent.runtime import Engine
from tests.cli.test_cache_options import _base


class Loaded(Exception):
    """Engine.load was called; its arguments."""

    def __init__(self, args, kwargs):
        super().__init__("loaded")
        self.args_, self.kwargs = args, kwargs


@pytest.fixture()
def recorded(monkeypatch):
    def load(*args, **kwargs):
        raise Loaded(args, kwargs)

    monkeypatch.setattr(Engine, "load", load)


COMMANDS = ["solve", "chat", "serve", "eval", "bench fidelity", "bench speed", "demo"]


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_hands_its_engine_the_decode_step(command, recorded, mini, jsonl_file, tmp_path):
    base = _base(command, tmp_path, mini, jsonl_file)
    with pytest.raises(Loaded) as got:
        run_app(app, [*base, "--model", "tiny-random-qwen3", "--device", "cpu", "--dtype", "float32",
                      "--decode-step", "eager"])  # fmt: skip
    assert got.value.args_[0] == "tiny-random-qwen3"
    kw = got.value.kwargs
    assert (kw["device"], kw["dtype"], kw["decode_step"]) == ("cpu", "float32", "eager")


def test_the_decode_step_defaults_to_auto(recorded, mini, jsonl_file, tmp_path):
    with pytest.raises(Loaded) as got:
        run_app(app, _base("solve", tmp_path, mini, jsonl_file))
    assert got.value.kwargs["decode_step"] == "auto"


def test_graph_on_a_cpu_is_one_line_before_the_model_loads(recorded, mini, jsonl_file, tmp_path, capsys):
    base = _base("solve", tmp_path, mini, jsonl_file)
    code = run_app(app, [*base, "--device", "cpu", "--decode-step", "graph"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("kvagent:")]
    assert code == 2 and err == [
        "kvagent: error: decode-step: graph needs CUDA; use static or compiled on a CPU"
    ]


def test_load_engine_checks_the_mode_before_reading_the_model(recorded):
    from kvagent.cli.common import load_engine

    with pytest.raises(ConfigError, match="^decode_step: got 'fast'; choose auto, eager"):
        load_engine(EngineOptions(model="tiny-random-qwen3", device="cpu", decode_step="fast"))
    with pytest.raises(Loaded) as got:
        load_engine(
            EngineOptions(model="tiny-random-qwen3", device="cpu", decode_step="compiled"), max_batch=2
        )
    assert got.value.kwargs == {
        "device": "cpu", "dtype": "auto", "max_batch": 2, "decode_step": "compiled", "linear": "auto"
    }  # fmt: skip
    with pytest.raises(ConfigError, match="^linear: got 'fast'; choose auto, packed, plain$"):
        load_engine(EngineOptions(model="tiny-random-qwen3", device="cpu", linear="fast"))
    with pytest.raises(ConfigError, match="^linear: packed takes float32 or bfloat16, not torch.float16"):
        load_engine(EngineOptions(model="tiny-random-qwen3", device="cpu", dtype="float16", linear="packed"))


def test_linear_reaches_the_engine_and_a_bad_one_is_one_line(recorded, mini, jsonl_file, tmp_path, capsys):
    base = _base("solve", tmp_path, mini, jsonl_file)
    with pytest.raises(Loaded) as got:
        run_app(app, [*base, "--linear", "plain"])
    assert got.value.kwargs["linear"] == "plain"
    code = run_app(app, [*base, "--linear", "fast"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("kvagent:")]
    assert code == 2 and err == ["kvagent: error: linear: got 'fast'; choose auto, packed, plain"]


def test_the_help_says_what_each_mode_is():
    from kvagent.cli.settings import ENGINE

    text = ENGINE["decode_step"].help
    for words in ("graph on CUDA, static on a CPU", "torch.compile", "~3k decode steps", "eager", "static"):
        assert words in text


def ray_setup(monkeypatch, mini, tmp_path, *extra, env="local"):
    """`eval --ray auto` as far as building its actors' EngineSetup (no Ray: a stand-in cluster); its
    arguments."""
    import kvagent.cli.eval.ray as eval_ray

    class Cluster:
        def cluster_resources(self):
            return {"GPU": 1}

    def setup(*args, **kwargs):
        raise Loaded(args, kwargs)

    monkeypatch.setattr(eval_ray, "init_ray", lambda address: (Cluster(), False))
    monkeypatch.setattr(eval_ray, "EngineSetup", setup)
    dataset, repos = mini
    with pytest.raises(Loaded) as got:
        run_app(app, ["eval", "--dataset", str(dataset), "--env", env, "--repos", str(repos), "--out",
                      str(tmp_path / "o"), "--policies", "full", "--modes", "persistent", "--ray", "auto", *extra])  # fmt: skip
    return got.value


def test_eval_ray_hands_its_actors_the_decode_step(monkeypatch, mini, tmp_path):
    got = ray_setup(monkeypatch, mini, tmp_path, "--decode-step", "graph", "--dtype", "bfloat16")
    # graph is left to each actor's device: this machine may have no GPU where the actors have one
    assert got.args_[0].decode_step == "graph" and got.args_[0].dtype == "bfloat16"


def test_an_actor_loads_its_engine_with_the_decode_step(recorded, tmp_path):
    from kvagent.cli.eval.ray import EngineSetup

    with pytest.raises(Loaded) as got:
        EngineSetup(
            EngineOptions(model="tiny-random-qwen3", device="cpu", decode_step="static"),
            {},
            "local",
            str(tmp_path),
        )()
    assert got.value.kwargs["decode_step"] == "static" and got.value.kwargs["device"] == "cpu"
