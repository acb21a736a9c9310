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
    for path in sorted((PKG / "cli").glob("app*.py")):
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


def test_no_benchmark_script_redeclares_a_cache_setting():
    """benchmarks/ scripts take cache settings through `add_arguments` (the GPU scripts aside, and
    the PyramidKV reference protocol's --keep / --beta, which mirror kvpress's side)."""
    flags = {
        "--" + f.name.replace("_", "-")
        for s in settings.CACHE.values()
        for f in (s.one, s.many, s.tokens)
        if f
    }
    found = [
        f"{p.name}:{flag}"
        for p in sorted((PKG.parent / "benchmarks").glob("*.py"))
        for flag in re.findall(r'add_argument\(\s*"(--[\w-]+)"', p.read_text(encoding="utf-8"))
        if flag in flags - {"--modes"} or flag == "--kv-budget"  # decode_modes' --modes: decode steps
    ]
    assert found == []
