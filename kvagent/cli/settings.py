"""Every setting that several commands share, declared once: its option spelling, help text and
value type, keyed by the field it sets (a `CacheConfig` field in `CACHE`, an `AgentConfig` one in
`AGENT`, an `Engine.load` argument in `ENGINE`); the checks are the config classes' own (the
engine's: `runtime.step.resolve_mode`, `common.load_engine`). A command takes them with
`cache_options(...)` / `agent_options(...)` / `engine_options(...)`: the decorator adds the options
to the command's signature (typer reads that) and hands the command ONE typed value,
`CacheOptions` / `AgentOptions` / `EngineOptions`. vLLM's `EngineArgs.add_cli_args` does the same
from its dataclass. The options several commands share besides those (progress, prefix reuse,
sandboxes, datasets: `OTHER`) are declared here too, as the typer types the commands annotate with
(`Quiet`, `Network`, ...), and the default models. This is the one home of option declarations; their
parsing is kvagent/options.py's.

A cache field has up to three forms: `one` (a run's value), `many` (a sweep's comma list: `eval
--budgets`, `bench fidelity --framework a,b`) and `tokens` (a budget in whole tokens: demo, bench
speed). Serve's `kv_*` request fields come from the same field list (`serve/kvconfig.py`)."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from functools import wraps
from typing import Annotated, Any

# typer (and rich under it) is imported only where a typer option is built: benchmarks/ scripts
# read these declarations through `add_arguments` on machines that have torch but no typer.


@dataclass(frozen=True)
class Form:
    """One option: its parameter name (the option is `--name` with dashes unless `flag`), what typer
    parses it as, and its help."""

    name: str
    type: Any
    help: str
    flag: str | None = None

    def annotation(self) -> Any:
        """The typer type a command's parameter is annotated with."""
        import typer

        return Annotated[self.type, typer.Option(*([self.flag] if self.flag else []), help=self.help)]

    def parameter(self, default: Any) -> inspect.Parameter:
        return inspect.Parameter(
            self.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default, annotation=self.annotation()
        )


@dataclass(frozen=True)
class Setting:
    one: Form
    many: Form | None = None  # a sweep's comma list
    tokens: Form | None = None  # whole tokens only


CACHE: dict[str, Setting] = {
    "policy": Setting(
        Form("policy", str, "Eviction policy: full, random, snapkv, nexus, ... (a wrong name lists them all)."),
        many=Form("policies", str, "Comma list of policies."),
    ),
    "budget": Setting(
        Form("budget", str | None, "K: entries per KV head kept at each round (int), or a fraction of the tokens "
             "so far (0.2); every policy but full needs one. Default: none (the full cache)."),
        many=Form("budgets", str, "Comma list of budgets (tokens, or fractions in (0,1))."),
        tokens=Form("budget", int, "K: entries per KV head kept at each eviction round, in tokens (a multiple "
                    "of the evicting policies' block)."),
    ),
    "buffer": Setting(Form("buffer", int, "r: a round every r tokens (at K + 2r entries; K + r under topk-all).")),
    "mode": Setting(
        Form("mode", str, "persistent | reprefill."), many=Form("modes", str, "Comma list: persistent, reprefill.")
    ),
    "scope": Setting(
        Form("scope", str, "prefill | prefill+decode."),
        many=Form("scopes", str, "Comma list: prefill, prefill+decode."),
    ),
    "protect": Setting(
        Form("protect", str, "prompt | sink | none."), many=Form("protect", str, "Comma list: prompt, sink, none.")
    ),
    "window": Setting(Form("window", int, "W: recent queries used for scoring.")),
    "seed": Setting(
        Form("seed", int, "Seeds eviction draws and sampling."),
        many=Form("seeds", str, "Comma list of seeds (Pass@1 averages over them)."),
    ),
    "policy_args": Setting(
        Form("policy_arg", list[str] | None, "Policy option [POLICY.]KEY=VALUE (repeatable): lam=0.5 with one "
             "policy, nexus.lam=0.5 with several.", flag="--policy-arg"),
    ),
    "head_budget": Setting(
        Form("head_budget", str, "uniform (K per head) | adaptive (Ada-KV: a layer's K x H_kv split by score)."),
        many=Form("head_budget", str, "Comma list: uniform (K per KV head), adaptive (Ada-KV; run for the "
                  "policies that support it, shown as POLICY+adaptive)."),
    ),
    "framework": Setting(
        Form("framework", str, "recent-buffer (the papers': the newest r entries are never scored, K + r kept) | "
             "topk-all (kvagent's before: the top K of all entries, each policy with its own recency keep)."),
        many=Form("framework", str, "Comma list: recent-buffer (the papers': the newest r entries never "
                  "scored), topk-all (kvagent's before)."),
    ),
    "cadence": Setting(
        Form("cadence", str, "layer (each layer's round at its own trigger) | shared (once a layer is due, every "
             "layer over K + r cuts too: one round per r tokens where layers keep different K, as pyramidkv's)."),
        many=Form("cadence", str, "Comma list: layer (each layer's round at its own trigger), shared (once a "
                  "layer is due, every layer over K + r cuts too; differs where layers hold different "
                  "counts, as pyramidkv's)."),
    ),
}  # fmt: skip

ONE_RUN = tuple(CACHE)  # solve, chat and serve take every cache field, one value each

AGENT: dict[str, Form] = {  # AgentConfig field -> its option
    "max_steps": Form("max_steps", int, "Hard limit on model calls (per request in chat)."),
    "max_new_tokens": Form(
        "max_new_tokens", int | None, "Tokens per reply (default 8192; no cap under --scaffold r2egym)."
    ),
    "context_limit": Form("context_limit", int, "Logical tokens; the episode ends cleanly there."),
    "temperature": Form("temperature", float, "Sampling temperature (0 = greedy)."),
    "top_p": Form("top_p", float | None, "Nucleus sampling. Default: the model's generation_config.json, else 1."),
    "top_k": Form("top_k", int | None, "Top-k sampling (0 = off). Default: the model's generation_config.json."),
    "prompt_style": Form("prompt_style", str, "Instance prompt: repo_first (eval) or issue_first (training)."),
    "prompts": Form("prompts", str | None, "YAML: system_prompt, instance_prompt ({problem_statement}); e.g. "
                    "R2E-Gym's. Default: the scaffold's own."),
    "r2egym_path": Form("r2egym", str | None, "Your checkout of R2E-Gym: its prompt file and the strings its "
                        "code hard-codes (with --scaffold r2egym; docs/deepswe.md).", flag="--r2egym"),
    "scaffold": Form("scaffold", str, "Protocol: kvagent, or r2egym (R2E-Gym's evaluation; docs/deepswe.md)."),
    "history": Form("history", str | None, "keep-thinking; drop-thinking (past replies' <think> leave the cache); "
                    "r2egym (each past reply as R2E-Gym re-renders it: its call); any of them +mask-observations[=M] "
                    "(or that alone): only the newest M tool outputs stay whole (M=10, The Complexity Trap), older "
                    "ones forgotten (persistent) or re-sent as one placeholder line (reprefill). Default: the "
                    "scaffold's (r2egym under --scaffold r2egym)."),
    "patch_rule": Form("patch_rule", str | None, "Graded patch: full (the whole diff) or r2egym (R2E-Gym's: .py "
                       "files edited with str_replace). Default: the scaffold's; both are recorded."),
}  # fmt: skip
# Left out (None): the scaffold's value.
LEFT_TO_SCAFFOLD = ("max_new_tokens", "history", "patch_rule")

ENGINE: dict[str, Form] = {  # Engine.load argument -> its option
    "model": Form("model", str, "smollm2 (bundled), tiny-random-qwen3, a hub id, a dir or .gguf."),
    "device": Form("device", str, "auto | cpu | cuda[:N]."),
    "dtype": Form("dtype", str, "auto | float32 | bfloat16 | float16."),
    "decode_step": Form("decode_step", str, "How decode tokens run: auto (graph on CUDA, static on a CPU) | "
                        "eager (the plain forward) | static (fixed buffers, op by op) | compiled "
                        "(torch.compile; pays only after ~3k decode steps) | graph (CUDA graphs; CUDA only). "
                        "Only decode tokens of evicting caches with a token budget take the static step: "
                        "dense caches (--policy full), fractional budgets, adaptive heads and prefill "
                        "chunks always run eager (serve's /metrics counts each eager forward's reason)."),
    "linear": Form("linear", str, "CPU matmuls: auto (oneDNN's prepacked weights for float32 on a CPU, and "
                   "bfloat16 on one with bf16 units; not under --decode-step compiled) | packed (float32 or bfloat16; holds the weights twice) | "
                   "plain (torch's F.linear)."),
}  # fmt: skip

AGENT_MODEL = "agentica-org/DeepSWE-Preview"  # solve, chat, eval, serve
BENCH_MODEL = "smollm2"  # demo, bench: the bundled small model

# The other options several commands share, by the typer type a command annotates its parameter with
# (`quiet: Quiet = False`); the type is built when first imported (module `__getattr__` below).
OTHER: dict[str, Form] = {
    "Quiet": Form("quiet", bool, "No progress bars.", flag="--quiet"),
    "ReusePrefix": Form("reuse_prefix", bool, "Reprefill runs: each rebuild starts from the previous one's "
                        "dense state at its last whole chunk (the same logits, a few times fewer forwards). "
                        "Off: less memory (no copy of the dense history), and wall times that are the "
                        "protocol's.", flag="--reuse-prefix/--no-reuse-prefix"),
    "Network": Form("network", str | None, "Docker sandboxes: none, or default (Docker's network, as "
                    "R2E-Gym's containers). Default: the scaffold's (default under --scaffold r2egym, none "
                    "under kvagent's)."),
    "Split": Form("split", str, "Dataset split (HF names, folders)."),
    "Instances": Form("instances", str | None, "Selection: ids a,b | slice 0:10 | re:REGEX | "
                      "repo:owner/name. Default: all."),
    "Isolation": Form("isolation", str, "Local sandboxes: bwrap (bubblewrap; refuses to start without it) "
                      "or none (the model's commands run on this host, unisolated). Docker containers are "
                      "always isolated."),
}  # fmt: skip


def __getattr__(name: str) -> Any:
    """`from kvagent.cli.settings import Quiet`: OTHER's typer type, built (and typer imported) now."""
    if name in OTHER:
        return OTHER[name].annotation()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# The value a command's `cache` / `agent` parameter is declared with; the decorator fills it in.
FROM_OPTIONS: Any = None


@dataclass(frozen=True)
class CacheOptions:
    """A command's cache options as typed: one value per field it takes as a run's (`policy`,
    `budget` as text), a comma list where it sweeps one (`policies`, `budgets`; text), and each
    other field at CacheConfig's default. `taken`: the options the command has."""

    policy: str = "full"
    budget: str | int | None = None  # text (`0.2`, `1024`), or whole tokens under the tokens form
    buffer: int = 128
    mode: str = "persistent"
    scope: str = "prefill+decode"
    protect: str = "prompt"
    window: int = 16
    seed: int = 0
    policy_arg: Sequence[str] | None = None
    head_budget: str = "uniform"
    framework: str = "recent-buffer"
    cadence: str = "layer"
    policies: str | None = None
    modes: str | None = None
    budgets: str | None = None
    scopes: str | None = None
    seeds: str | None = None
    taken: tuple[str, ...] = ()

    @classmethod
    def of(cls, value: CacheOptions | Mapping[str, Any]) -> CacheOptions:
        """`value` itself, or the options a caller (a test, a script) passes as option: value."""
        return value if isinstance(value, CacheOptions) else cls(**value, taken=tuple(value))

    def config(self) -> Any:
        """The CacheConfig of a one-run command (solve, chat, serve), checked before the model loads."""
        from kvagent.options import cache_config

        names = [f.one.name for f in CACHE.values()]
        return cache_config(**{n: getattr(self, n) for n in names})

    def given(self) -> dict[str, Any]:
        """option name: value, for each option the command has (eval's grid record)."""
        return {n: getattr(self, n) for n in self.taken}

    def fields(self) -> dict[str, Any]:
        """The run fields the command takes one value of, as RunSpec takes them (eval: buffer, scope,
        ...); its lists and --policy-arg are the command's to parse."""
        return {n: getattr(self, n) for n in self.taken if n in CACHE and n != "policy_args"}


@dataclass(frozen=True)
class AgentOptions:
    """A command's agent options as typed (AgentConfig's fields, `r2egym` for r2egym_path), and the
    values it fixes without an option (solve's --seed, eval's prompt style). `taken`: those set."""

    max_steps: int = 100
    max_new_tokens: int | None = None
    context_limit: int = 65_536
    temperature: float = 1.0
    top_p: float | None = None
    top_k: int | None = None
    prompt_style: str = "repo_first"
    prompts: str | None = None
    r2egym: str | None = None
    scaffold: str = "kvagent"
    history: str | None = None
    patch_rule: str | None = None
    seed: int | None = 0
    taken: tuple[str, ...] = ()

    def fixed(self, **values: Any) -> AgentOptions:
        """These options with `values` set (fields a command fixes: the session's seed)."""
        from dataclasses import replace

        return replace(self, **values, taken=tuple(dict.fromkeys((*self.taken, *values))))

    def arguments(self) -> dict[str, Any]:
        """AgentConfig's arguments: an option left out (None) is the scaffold's (per-reply cap,
        history, patch rule) or, for top_p / top_k, the model's generation_config.json."""
        from kvagent.agent.config import BY_SCAFFOLD

        field = {form.name: name for name, form in AGENT.items()}
        out = {field.get(n, n): getattr(self, n) for n in self.taken}
        return {**out, **{k: BY_SCAFFOLD for k in LEFT_TO_SCAFFOLD if out.get(k) is None}}

    def config(self) -> Any:
        """The AgentConfig, its sampling settings checked now, not at the first reply."""
        return agent_config(**self.arguments())

    def given(self) -> dict[str, Any]:
        return {n: getattr(self, n) for n in self.taken if n in {f.name for f in AGENT.values()}}


@dataclass(frozen=True)
class EngineOptions:
    """A command's engine options as typed, handed whole to the command body and `common.load_engine`;
    the one home of their defaults (`auto`: the engine resolves device, dtype, decode step and linear
    for the machine it runs on). A --decode-step that names no mode fails as the command starts; one
    its device cannot run (graph on a CPU) when the engine is about to load, before the model is
    read (under --ray, on each actor's node)."""

    model: str = "smollm2"
    device: str = "auto"
    dtype: str = "auto"
    decode_step: str = "auto"
    linear: str = "auto"
    taken: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        import torch

        from kvagent.runtime import linear
        from kvagent.runtime.step import check_mode

        check_mode(self.decode_step)  # whether a known mode runs here is check_engine's question
        if self.linear not in linear.MODES:
            linear.resolve(self.linear, torch.device("cpu"), torch.float32)

    def given(self) -> dict[str, Any]:
        """option name: value (model, device, dtype, decode_step, linear), for eval's grid record."""
        return {n: getattr(self, n) for n in ENGINE}


def cache_config_of(cache: CacheOptions | Mapping[str, Any]) -> Any:
    """The CacheConfig of a one-run command's options (typed, or option: value from a test)."""
    return CacheOptions.of(cache).config()


def agent_config_of(agent: AgentOptions | Mapping[str, Any]) -> Any:
    """The AgentConfig of a command's agent options (typed, or AgentConfig's arguments from a test)."""
    if isinstance(agent, AgentOptions):
        return agent.config()
    return agent_config(**agent)


def agent_config(**options: Any) -> Any:
    """The AgentConfig of the agent options; the sampling settings (temperature ...) are checked now,
    not at the first reply."""
    from kvagent.agent.config import AgentConfig

    config = AgentConfig(**options)
    config.sampling()
    return config


def cache_args(values: Mapping[str, Any]) -> dict[str, Any]:
    """Of option values by name (a test's, a script's), those named as a run's CacheConfig fields,
    as `options.cache_config` takes them. Commands get theirs typed (`CacheOptions`)."""
    from kvagent.runspec import IDENTITY

    return {k: v for k, v in values.items() if k in IDENTITY}


def agent_args(values: Mapping[str, Any], **fixed: Any) -> dict[str, Any]:
    """The AgentConfig arguments of agent option values by name (a test's, a script's) and `fixed`
    (values not taken as options); `AgentOptions.arguments` says how."""
    names = {f.name for f in fields(AgentOptions)} - {"taken"}
    picked = {k: v for k, v in values.items() if k in names}
    return AgentOptions(**picked, taken=tuple(picked)).fixed(**fixed).arguments()


def cache_options(
    one: Sequence[str] = (), many: Sequence[str] = (), tokens: Sequence[str] = (), **defaults: Any
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command the CACHE options of these fields (`one`: a run's value, `many`: a sweep's
    comma list, `tokens`: whole tokens), in place of its `cache: CacheOptions` parameter;
    `defaults`: this command's default per option name, where not CacheOptions'."""
    forms = [CACHE[f].one for f in one] + [CACHE[f].many for f in many] + [CACHE[f].tokens for f in tokens]
    return _takes("cache", CacheOptions, [f for f in forms if f is not None], defaults)


def agent_options(*names: str, **defaults: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command the AGENT options of these AgentConfig fields in place of its `agent:
    AgentOptions` parameter."""
    return _takes("agent", AgentOptions, [AGENT[n] for n in names], defaults)


def engine_options(**defaults: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command the ENGINE options (model, device, dtype, decode step, linear) in place of its `engine:
    EngineOptions` parameter; `defaults`: this command's (its model)."""
    return _takes("engine", EngineOptions, list(ENGINE.values()), defaults)


def add_arguments(
    parser: Any, one: Sequence[str] = (), many: Sequence[str] = (), tokens: Sequence[str] = (),
    engine: Sequence[str] = (), **defaults: Any,
) -> None:  # fmt: skip
    """The argparse side of `cache_options` / `engine_options`, for benchmarks/ scripts: add to
    `parser` the CACHE options of these fields (`one`, `many`, `tokens` as there) and the ENGINE
    options named in `engine`, each with the commands' spelling, help and value type; `defaults`: the
    script's, per option name (else CacheOptions' / EngineOptions'). `cache_of` / `engine_of` read
    the parsed values back as the typed options."""
    forms = [CACHE[f].one for f in one] + [CACHE[f].many for f in many] + [CACHE[f].tokens for f in tokens]
    base = {f.name: f.default for f in (*fields(CacheOptions), *fields(EngineOptions))}
    for form in [f for f in forms if f is not None] + [ENGINE[n] for n in engine]:
        kinds = [t for t in typing.get_args(form.type) or (form.type,) if t is not type(None)]
        many_values = typing.get_origin(kinds[0]) is list  # a repeatable option (--policy-arg)
        parser.add_argument(
            form.flag or "--" + form.name.replace("_", "-"), dest=form.name, help=form.help,
            default=defaults.get(form.name, base[form.name]),
            **({"action": "append", "type": str} if many_values else {"type": kinds[0]}),
        )  # fmt: skip


def cache_of(args: Any) -> CacheOptions:
    """The CacheOptions of an argparse namespace (`add_arguments`'): each option it has."""
    names = [f.name for f in fields(CacheOptions) if f.name != "taken" and hasattr(args, f.name)]
    return CacheOptions(**{n: getattr(args, n) for n in names}, taken=tuple(names))


def engine_of(args: Any) -> EngineOptions:
    """The EngineOptions of an argparse namespace: each ENGINE option it has, else the default."""
    names = [n for n in ENGINE if hasattr(args, n)]
    return EngineOptions(**{n: getattr(args, n) for n in names}, taken=tuple(names))


def _takes(
    param: str, kind: type, forms: Sequence[Form], defaults: Mapping[str, Any]
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    base = {f.name: f.default for f in fields(kind)}
    names = [f.name for f in forms]

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        hints = typing.get_type_hints(fn, include_extras=True)
        signature = inspect.signature(fn)
        params: list[inspect.Parameter] = []
        for p in signature.parameters.values():
            if p.name == param:
                params += [f.parameter(defaults.get(f.name, base[f.name])) for f in forms]
            else:
                params.append(p.replace(annotation=hints.get(p.name, p.annotation)))

        @wraps(fn)
        def command(*args: Any, **kwargs: Any) -> Any:
            values = {n: kwargs.pop(n) for n in names}
            return fn(*args, **kwargs, **{param: kind(**values, taken=tuple(names))})

        command.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return decorate
