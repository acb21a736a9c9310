"""Each cache option, through every command that has it: a good value gets as far as loading the
model (every check before it passed), a bad one stops there with one line naming the option and
exit 2. The model load is replaced by a marker, so nothing slow runs."""

from __future__ import annotations

import pytest

from kvagent.cli.app import app
from kvagent.cli.exits import run_app


class Reached(Exception):
    """The command got as far as loading its model."""


@pytest.fixture()
def no_model(monkeypatch):
    import kvagent.cli.bench.run
    import kvagent.cli.common
    import kvagent.cli.eval.run
    import kvagent.cli.solve

    def load(*a, **k):
        raise Reached

    for module in (kvagent.cli.common, kvagent.cli.bench.run, kvagent.cli.eval.run, kvagent.cli.solve):
        monkeypatch.setattr(module, "load_engine", load)


EVICT = ["--policy", "snapkv", "--budget", "1024"]
ONE_RUN = {  # option: (good, bad) argument lists, for the commands that run one cache config
    "policy": (EVICT, ["--policy", "nosuch", "--budget", "1024"]),
    "budget": (["--policy", "snapkv", "--budget", "0.25"], ["--policy", "snapkv", "--budget", "lots"]),
    "buffer": ([*EVICT, "--buffer", "64"], ["--buffer", "0"]),
    "mode": (["--mode", "reprefill"], ["--mode", "sometimes"]),
    "scope": (["--scope", "prefill"], ["--scope", "decode"]),
    "protect": (["--protect", "sink"], ["--protect", "all"]),
    "window": (["--window", "8"], ["--window", "0"]),
    "seed": (["--seed", "3"], ["--seed", "x"]),
    "policy-arg": (["--policy", "nexus", "--budget", "1024", "--policy-arg", "lam=0.5"],
                   ["--policy", "nexus", "--budget", "1024", "--policy-arg", "lam"]),
    "head-budget": ([*EVICT, "--head-budget", "adaptive"], ["--head-budget", "half"]),
    "framework": (["--framework", "topk-all"], ["--framework", "none"]),
    "cadence": (["--cadence", "shared"], ["--cadence", "never"]),
}  # fmt: skip
SWEEP = {  # eval's and bench fidelity's lists
    "policies": (["--policies", "full,snapkv"], ["--policies", "full,nosuch"]),
    "modes": (["--modes", "reprefill"], ["--modes", "persistent,sometimes"]),
    "budgets": (["--budgets", "1024,0.25"], ["--budgets", "1024,0"]),
    "buffer": (["--buffer", "64"], ["--buffer", "0"]),
    "protect": (["--protect", "sink"], ["--protect", "all"]),
    "window": (["--window", "8"], ["--window", "0"]),
    "policy-arg": (["--policies", "nexus", "--policy-arg", "lam=0.5"], ["--policy-arg", "lam"]),
    "head-budget": (["--head-budget", "adaptive"], ["--head-budget", "half"]),
    "framework": (["--framework", "topk-all"], ["--framework", "none"]),
    "cadence": (["--cadence", "shared"], ["--cadence", "never"]),
}
EVAL = {**SWEEP, "scope": (["--scope", "prefill"], ["--scope", "decode"]),
        "seeds": (["--seeds", "0,1"], ["--seeds", "0,x"])}  # fmt: skip
FIDELITY = {**SWEEP, "scopes": (["--scopes", "prefill"], ["--scopes", "decode"]),
            "seed": (["--seed", "3"], ["--seed", "x"])}  # fmt: skip
SPEED = {
    "policies": (["--policies", "full,snapkv"], ["--policies", "full,nosuch"]),
    "budget": (["--budget", "512"], ["--budget", "0.25"]),
    "buffer": (["--buffer", "64"], ["--buffer", "0"]),
    "framework": (["--framework", "topk-all"], ["--framework", "none"]),
    "policy-arg": (["--policy-arg", "snapkv.keep_window=false"], ["--policy-arg", "lam"]),
}
DEMO = {"budget": (["--budget", "256"], ["--budget", "0.25"]), "seed": (["--seed", "3"], ["--seed", "x"])}
# Every command that loads an engine: a mode its device cannot run (graph on a CPU) is load_engine's
# to refuse (test_engine_options.py), so the good value here is one every device runs.
ENGINE = {"decode-step": (["--decode-step", "eager"], ["--decode-step", "sometimes"])}


def _base(command, tmp, mini, jsonl):
    dataset, repos = mini
    return {
        "solve": ["solve", "--issue", "x", "--repo", str(repos), "--isolation", "none", "--out", str(tmp / "o")],
        "chat": ["chat", "--repo", str(repos), "--isolation", "none"],
        "serve": ["serve", "--port", "0"],
        "eval": ["eval", "--dataset", str(dataset), "--env", "local", "--repos", str(repos), "--isolation",
                 "none", "--out", str(tmp / "o"), "--policies", "full,snapkv", "--modes", "persistent"],
        "bench fidelity": ["bench", "fidelity", "--episodes", f"{jsonl}:first=1", "--out", str(tmp / "o"),
                           "--policies", "snapkv", "--modes", "persistent", "--budgets", "1024"],
        "bench speed": ["bench", "speed", "--episode", f"{jsonl}:first=1", "--out", str(tmp / "o"),
                        "--policies", "snapkv"],
        "demo": ["demo", "--out", str(tmp / "o")],
    }[command]  # fmt: skip


CASES = [
    (command, option, good, bad)
    for command, table in [("solve", ONE_RUN), ("chat", ONE_RUN), ("serve", ONE_RUN), ("eval", EVAL),
                           ("bench fidelity", FIDELITY), ("bench speed", SPEED), ("demo", DEMO)]
    for table in (table, ENGINE)
    for option, (good, bad) in table.items()
]  # fmt: skip


@pytest.mark.parametrize("command, option, good, bad", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_a_good_value_reaches_the_model_and_a_bad_one_is_one_line(
    command, option, good, bad, no_model, mini, jsonl_file, tmp_path, capsys
):
    base = _base(command, tmp_path, mini, jsonl_file)
    with pytest.raises(Reached):
        run_app(app, [*base, *good])
    capsys.readouterr()
    code = run_app(app, [*base, *bad])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("kvagent: error: "), err
    assert option.split("-")[0] in err[0], err[0]
