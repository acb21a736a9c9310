"""`kvagent images`: every subcommand is reachable, and bad input is one line with exit 2."""

from typer.testing import CliRunner

from kvagent.cli.app import app


def test_images_lists_base_build_and_check():
    out = CliRunner().invoke(app, ["images", "--help"]).output
    assert all(name in out for name in ("base", "build", "check"))


def test_images_check_names_a_missing_dataset(tmp_path):
    res = CliRunner().invoke(
        app, ["images", "check", "--instances", "x__y-1", "--dataset", str(tmp_path / "none.jsonl")]
    )
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("kvagent: error:") and "none.jsonl" in lines[0]


def test_images_check_reports_a_failed_build_per_instance(tmp_path, monkeypatch):
    """The command wires the check to a sandbox opener and reports each instance; a build that fails
    is a verdict line (exit 1), not a traceback."""
    from pathlib import Path

    import kvagent.evals.images as images
    from kvagent.errors import KvagentError

    def no_build(instance, **kw):
        raise KvagentError(f"no base image for {instance.instance_id}")

    monkeypatch.setattr(images, "build_instance_image", no_build)
    data = Path(__file__).parents[1] / "evals" / "data" / "harness_instances.jsonl"
    res = CliRunner().invoke(
        app,
        ["images", "check", "--instances", "pytest-dev__pytest-11148", "--dataset", str(data),
         "--out", str(tmp_path)],
    )  # fmt: skip
    assert res.exit_code == 1, res.output
    assert "pytest-dev__pytest-11148  builds NO" in res.output and "0/1 verified" in res.output
    assert (tmp_path / "check.json").is_file()
