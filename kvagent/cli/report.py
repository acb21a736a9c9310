"""`kvagent report`: write a run directory's report files and print its table."""

from __future__ import annotations

from pathlib import Path


def run_report(run_dir: str) -> dict:
    import typer

    from kvagent.evals.report import write_report

    summary = write_report(run_dir)
    typer.echo((Path(run_dir) / "report.md").read_text(encoding="utf-8"))
    return summary
