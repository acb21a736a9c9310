"""What the command-line audit found about output: a file error is one line, not a traceback; error
messages spell options as typed; help text survives rich markup; reports are tables on a terminal;
long paths are never wrapped; Ctrl-C says how to resume; hopeless settings fail before the work."""

import importlib
import io
import json

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from kvagent.cli.app import app
from kvagent.cli.settings import EngineOptions
from kvagent.evals.datasets import Instance
from kvagent.testing import ScriptedEngine, git_repo
from tests.helpers import SUBMIT


def invoke(args, **kw):
    return CliRunner().invoke(app, [str(a) for a in args], **kw)


@pytest.fixture()
def repo(tmp_path):
    root = tmp_path / "a-repository-with-a-rather-long-directory-name" / "repo"
    git_repo(root, {"calc.py": "def add(a, b):\n    return a - b\n"})
    return root


@pytest.fixture()
def scripted(monkeypatch, qwen3_tokenizer):
    """solve, chat and eval get a scripted model that submits at once."""
    engine = ScriptedEngine(qwen3_tokenizer, lambda config: [SUBMIT])
    engine.n_layers = 2
    # Imported first: a module imported while common's is patched would keep the patch as its own.
    for module in [importlib.import_module(f"kvagent.cli.{m}") for m in ("common", "solve", "eval.run")]:
        monkeypatch.setattr(module, "load_engine", lambda *a, **k: engine)
    return engine


# ------------------------------------------------------------------------------------------ errors
def test_a_file_error_is_one_line_and_exit_1(monkeypatch):
    def broken(run_dir):
        raise PermissionError(13, "Permission denied", f"{run_dir}/report.md")

    monkeypatch.setattr("kvagent.cli.eval.report.run_report", broken)
    r = invoke(["report", "runs/x"])
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert (
        r.stderr.strip()
        == "kvagent: error: Permission denied: runs/x/report.md; check the path and its permissions"
    )


def test_error_messages_spell_fields_as_the_options_are_typed():
    from kvagent.cli.exits import cli_spelling

    assert cli_spelling("max_steps: must be >= 1, got 0") == "max-steps: must be >= 1, got 0"
    assert (
        cli_spelling("policy_args: snapkv has no option(s) foo") == "policy-arg: snapkv has no option(s) foo"
    )
    assert cli_spelling("policy_args.kernel: must be odd") == "policy-arg kernel: must be odd"
    # run labels and instance ids (double underscores) and plain names stay as they are
    for kept in ("nexus__persistent__K1000: budget: 1000", "budget: K=64", "sqlfluff__sqlfluff-1625: x"):
        assert cli_spelling(kept) == kept


# -------------------------------------------------------------------------------------------- help
def _commands(group, prefix=()):
    for name, cmd in getattr(group, "commands", {}).items():
        yield (*prefix, name), cmd
        yield from _commands(cmd, (*prefix, name))


def test_every_help_text_survives_rich_markup():
    """Typer renders help as rich markup: `[ray]` in `kvagent[ray]` would vanish unless escaped."""
    from rich.text import Text

    for path, cmd in _commands(typer.main.get_command(app)):
        for p in cmd.params:
            text = getattr(p, "help", None) or ""
            shown = Text.from_markup(text).plain
            assert shown == text.replace("\\[", "["), (path, p.name, text, shown)
    assert "kvagent[ray]" in invoke(["eval", "--help"], env={"COLUMNS": "300"}).stdout


def test_version():
    r = invoke(["--version"])
    assert r.exit_code == 0 and r.stdout.startswith("kvagent ") and r.stdout.split()[1][0].isdigit()


# ------------------------------------------------------------------------------------------ tables
MD = "Speeds:\n\n| policy | ms |\n|---|---:|\n| full | 1.00 |\n| snapkv | 0.50 |\n"


def test_markdown_reports_are_tables_on_a_terminal_and_markdown_when_piped():
    from kvagent.cli.ui import print_markdown

    tty = Console(file=io.StringIO(), force_terminal=True, width=80, color_system=None)
    print_markdown(MD, tty)
    drawn = tty.file.getvalue()
    assert "|---|" not in drawn and "─" in drawn and "snapkv" in drawn
    piped = Console(file=io.StringIO(), force_terminal=False)
    print_markdown(MD, piped)
    assert piped.file.getvalue() == MD + "\n"


# ------------------------------------------------------------------------------------ whole paths
def test_solve_keeps_the_paths_of_its_results_on_one_line(scripted, repo, tmp_path):
    from kvagent.cli import solve
    from kvagent.cli.settings import agent_args

    console = Console(file=io.StringIO(), width=40, color_system=None)
    out = tmp_path / "a-results-directory-with-a-long-name"
    solve.run_solve(
        issue="add subtracts", repo=str(repo), image=None, engine=EngineOptions(model="scripted"), out=str(out),
        console=console,
        cache={"policy": "full", "budget": None, "buffer": 32},
        agent=agent_args(dict(max_steps=3, max_new_tokens=64, context_limit=8192, temperature=0.0)), isolation="none",
    )  # fmt: skip
    assert f"trajectory: {out / 'episode.traj.json'}; patch: {out / 'patch.diff'}" in console.file.getvalue()


def test_chat_shows_the_repository_path_on_one_line(scripted, repo):
    r = invoke(["chat", "--repo", repo, "--isolation", "none"], input="/quit\n")
    assert r.exit_code == 0, r.output
    assert f"working on a copy of {repo.resolve()} (your checkout is never edited) | full" in r.stdout


def test_clean_keeps_the_docker_note_on_one_line(monkeypatch):
    from kvagent.cli.clean import run_clean
    from kvagent.sandbox.errors import DockerUnavailableError

    def unreachable(*a, **k):
        raise DockerUnavailableError(
            "cannot reach the Docker daemon (X); start it (`dockerd`) or set DOCKER_HOST"
        )

    monkeypatch.setattr("kvagent.sandbox.docker_backend.docker_client", unreachable)
    monkeypatch.setattr("kvagent.sandbox.owner.sweep_dirs", lambda **kw: [])
    console = Console(file=io.StringIO(), width=40, color_system=None)
    run_clean(console=console)
    assert "or set DOCKER_HOST); pass --no-docker to skip them" in console.file.getvalue()


# ------------------------------------------------------------------------- checks before the work
@pytest.mark.parametrize("command", [["solve", "--issue", "add subtracts"], ["chat"]])
def test_a_context_limit_below_the_first_prompt_fails_before_the_sandbox(
    scripted, repo, command, monkeypatch
):
    def no_sandbox(*a, **k):
        raise AssertionError("a sandbox was opened")

    monkeypatch.setattr("kvagent.sandbox.open_sandbox", no_sandbox)
    r = invoke([*command, "--repo", repo, "--isolation", "none", "--context-limit", "10"])
    assert r.exit_code == 2, r.output
    assert "kvagent: error: context-limit: 10 tokens, but the first prompt is" in r.stderr
    assert "use --context-limit above" in r.stderr


def test_fidelity_fails_before_the_reference_when_every_setting_would_be_skipped(tmp_path):
    out = tmp_path / "out"
    r = invoke(["bench", "fidelity", "--model", "tiny-random-qwen3", "--device", "cpu", "--policies", "snapkv",
                "--modes", "persistent", "--budgets", "64", "--episodes", "gen:seed=0,turns=10", "--out", out,
                "--quiet"])  # fmt: skip
    assert r.exit_code == 2, r.output
    assert "budgets: all 1 evicting settings would be skipped" in r.stderr and "--budgets " in r.stderr
    assert not (out / "fidelity.json").exists()  # no reference replay was spent on it


def test_demo_budget_advice_names_only_its_own_options(monkeypatch, tmp_path):
    r = invoke(["demo", "--model", "tiny-random-qwen3", "--device", "cpu", "--budget", "64", "--turns", "10",
                "--out", tmp_path / "demo", "--quiet"])  # fmt: skip
    assert r.exit_code == 2, r.output
    line = r.stderr.strip().splitlines()[-1]
    assert "cannot hold the episode's protected prompt" in line and "use --budget " in line
    assert "--protect" not in line  # demo has no such option


# ---------------------------------------------------------------------------------------- Ctrl-C
def test_an_interrupted_benchmark_says_how_to_resume(capsys):
    from kvagent.cli.common import resume_hint

    with pytest.raises(KeyboardInterrupt), resume_hint("bench-out"):
        raise KeyboardInterrupt
    assert "finished runs are kept in bench-out; rerun the same command to resume" in capsys.readouterr().err


def test_an_interrupted_eval_says_what_is_saved_and_how_to_resume(scripted, tmp_path, monkeypatch):
    repos = tmp_path / "repos"
    git_repo(repos / "fixture__calc-1", {"calc.py": "def add(a, b):\n    return a - b\n"})
    inst = Instance(
        "fixture__calc-1", "fixture/calc", "HEAD", "add() subtracts", "diff --git a/t b/t\n", ["t"], []
    )
    dataset = tmp_path / "mini.jsonl"
    dataset.write_text(json.dumps(inst.to_record()) + "\n")

    def ctrl_c(self, runs, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr("kvagent.cli.eval.run.EvalRunner.run", ctrl_c)
    out = tmp_path / "run"
    r = invoke(["eval", "--dataset", dataset, "--env", "local", "--repos", repos, "--isolation", "none",
                "--no-grade", "--policies", "full", "--modes", "persistent", "--out", out])  # fmt: skip
    assert r.exit_code == 130, r.output
    assert f"0 of 1 runs are saved in {out}; rerun the same command to resume the rest" in r.stderr
