"""One declaration per setting (issue #47): each cache field and each shared agent setting is
declared as an option once, in cli/settings.py, and no command re-declares it; the commands'
settings travel as typed values, never as the parsed-parameters dict."""

from __future__ import annotations

import ast
import re
from dataclasses import fields
from pathlib import Path

from kvagent import runspec
from kvagent.agent.config import AgentConfig
from kvagent.cli import settings
from kvagent.serve.kvconfig import kv_fields

PKG = Path(settings.__file__).parents[1]
# Options that share a spelling with a setting but are another setting: demo's --seed seeds the
# generated episode, bench serve's --seed and --temperature are each request's.
# Same names, other settings: bench fidelity's --history is a comma list of replay histories (keep,
# mask-observations[=M]), not the agent's one history rule.
OTHER_SETTINGS = {("demo", "seed"), ("bench_serve", "seed"), ("bench_serve", "temperature"),
                  ("bench_fidelity", "history")}  # fmt: skip


def _names(form_set):
    return {f.name for s in form_set for f in (s.one, s.many, s.tokens) if f is not None}


def test_every_cache_field_has_one_declaration_and_serve_asks_the_same_list():
    assert sorted(settings.CACHE) == sorted(runspec.IDENTITY)
    assert set(kv_fields().values()) == set(settings.CACHE)
    assert set(settings.AGENT) <= {f.name for f in fields(AgentConfig)}


def test_no_command_declares_a_shared_setting_itself():
    """Counted from the source: a parameter of a command in kvagent/cli named as a cache, agent or
    engine option (or one of settings.OTHER's shared typer types) would be a second declaration."""
    shared = _names(settings.CACHE.values()) | {
        f.name for f in (*settings.AGENT.values(), *settings.ENGINE.values())
    }
    found = []
    declarations = [PKG / "cli" / "app.py", *sorted((PKG / "cli").glob("*/commands.py"))]
    assert len(declarations) == 7, declarations  # app.py and each family's commands.py
    for path in declarations:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef) and any(
                isinstance(d, ast.Call | ast.Name | ast.Attribute) for d in node.decorator_list
            ):
                found += [(node.name, a.arg) for a in node.args.args if a.arg in shared]
    assert [f for f in found if f not in OTHER_SETTINGS] == []
    assert [f.name for f in settings.OTHER.values() if f.name in shared] == []
    camel = {"".join(w.title() for w in n.split("_")) for n in shared}
    assert [a for a in settings.OTHER if a in camel] == []


def test_settings_travel_typed():
    uses = [
        f"{p.relative_to(PKG)}:{i}"
        for p in sorted(PKG.rglob("*.py"))
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if "ctx.params" in line or "**sweep" in line
    ]
    assert uses == []


def test_a_command_gets_its_options_as_one_typed_value():
    seen = {}

    @settings.cache_options(["buffer"], many=["policy"], policies="full,snapkv")
    @settings.agent_options("max_steps")
    def command(name: str = "x", cache: settings.CacheOptions = None, agent: settings.AgentOptions = None):
        seen.update(name=name, cache=cache, agent=agent)

    import inspect

    assert list(inspect.signature(command).parameters) == ["name", "buffer", "policies", "max_steps"]
    command(name="y", buffer=64, policies="snapkv", max_steps=3)
    assert seen["cache"].buffer == 64 and seen["cache"].policies == "snapkv"
    assert seen["cache"].taken == ("buffer", "policies") and seen["cache"].fields() == {"buffer": 64}
    assert seen["agent"].fixed(seed=1).arguments()["max_steps"] == 3


def test_an_option_left_at_its_default_is_the_configs_default():
    """The options' defaults are written beside their declarations (importing the runtime for them
    would load torch for `--help`): held here to CacheConfig's and AgentConfig's."""
    from kvagent.agent.config import BY_SCAFFOLD

    cache = {f.name: f.default for f in fields(settings.CacheOptions)}
    config = runspec.DEFAULTS
    assert {name: cache[s.one.name] for name, s in settings.CACHE.items() if name != "policy_args"} == {
        name: config[name] for name in settings.CACHE if name != "policy_args"
    }
    agent = {f.name: f.default for f in fields(settings.AgentOptions)}
    want = {f.name: f.default for f in fields(AgentConfig)}
    for name, form in settings.AGENT.items():
        expected = None if want[name] == BY_SCAFFOLD else want[name]
        assert agent[form.name] == expected, name


def test_benchmark_scripts_take_the_same_options_on_argparse():
    """`add_arguments` (benchmarks/): each option's spelling, help and value type as the commands
    declare it, the script's defaults, and the values back as the typed options."""
    import argparse

    ap = argparse.ArgumentParser()
    settings.add_arguments(
        ap, one=["policy", "buffer", "policy_args"], tokens=["budget"], many=["head_budget"],
        engine=["model", "dtype"], policy="random", dtype="float32",
    )  # fmt: skip
    helps = {a.dest: a.help for a in ap._actions}
    assert helps["buffer"] == settings.CACHE["buffer"].one.help
    assert helps["dtype"] == settings.ENGINE["dtype"].help
    args = ap.parse_args(
        ["--budget", "64", "--policy-arg", "lam=0.5", "--policy-arg", "n=3", "--buffer", "8"]
    )
    cache, engine = settings.cache_of(args), settings.engine_of(args)
    assert (cache.policy, cache.budget, cache.buffer, cache.head_budget) == ("random", 64, 8, "uniform")
    assert cache.policy_arg == ["lam=0.5", "n=3"] and cache.window == 16  # a field not taken: its default
    assert (engine.model, engine.dtype, engine.device) == ("smollm2", "float32", "auto")


def test_no_benchmark_script_redeclares_a_cache_or_engine_setting():
    """benchmarks/ scripts, the GPU ones included, take cache and engine settings through
    `add_arguments` (the PyramidKV reference protocol's --keep / --beta aside, which mirror kvpress's
    side, and kvpress_reference.py's --model, a directory in kvpress's own environment)."""
    flags = {
        "--" + f.name.replace("_", "-")
        for s in settings.CACHE.values()
        for f in (s.one, s.many, s.tokens)
        if f
    } | {"--" + f.name.replace("_", "-") for f in settings.ENGINE.values()}
    found = [
        f"{p.relative_to(PKG.parent / 'benchmarks')}:{flag}"
        for p in sorted((PKG.parent / "benchmarks").rglob("*.py"))
        for flag in re.findall(r'add_argument\(\s*"(--[\w-]+)"', p.read_text(encoding="utf-8"))
        if flag in flags - {"--modes"} or flag == "--kv-budget"  # decode_modes' --modes: decode steps
    ]
    assert [f for f in found if f != "kvpress_reference.py:--model"] == []


# What a GPU machine may lack: benchmarks/gpu/ scripts run there with torch but maybe no typer or rich.
NO_TYPER = """
import sys
for name in ("typer", "rich", "click"):
    sys.modules[name] = None  # `import typer` raises ImportError, as where it is not installed
sys.path[:0] = [{root!r}, {gpu!r}]
"""


def test_the_declarations_and_the_gpu_scripts_options_need_no_typer(tmp_path):
    """The declarations and their argparse adapter import without typer (typer is imported only where
    a typer option is built), and the GPU scripts parse the commands' options with their own defaults."""
    import subprocess
    import sys

    root = PKG.parent
    boot = NO_TYPER.format(root=str(root), gpu=str(root / "benchmarks" / "gpu"))
    code = (
        boot
        + f"""
import argparse
from kvagent.cli import settings
assert settings.__file__.startswith({str(root)!r})
ap = argparse.ArgumentParser()
settings.add_arguments(ap, one=["policy", "buffer"], tokens=["budget"], engine=["device", "dtype"])
args = ap.parse_args(["--budget", "64", "--device", "cpu"])
assert (args.budget, args.buffer, args.device, args.dtype) == (64, 128, "cpu", "auto"), args
try:
    settings.Quiet  # a typer type: built, typer imported, only when asked for
except ImportError:
    pass
else:
    raise AssertionError("typer was not blocked")
import run, profile_policy
a = run.parse(["--out", {str(tmp_path)!r}, "--quick", "--device", "cpu"])
assert (a.device, a.policies) == ("cpu", None), a
p = profile_policy.parse(["--out", {str(tmp_path)!r}])
assert (p.device, p.budget, p.buffer, p.policies) == ("auto", 2048, 128, ["snapkv", "pyramidkv"]), p
q = profile_policy.parse(["--out", {str(tmp_path)!r}, "--quick", "--policies", "random"])
assert (q.budget, q.buffer, q.policies) == (64, 32, ["random"]), q
loaded = [n for n in ("typer", "rich", "click") if sys.modules.get(n) is not None]
assert not loaded, loaded
print("OK")
"""
    )
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip().endswith("OK")
