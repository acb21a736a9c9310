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
