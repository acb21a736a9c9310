"""`kvagent report`: write a run directory's report files and print its table."""

from __future__ import annotations

from pathlib import Path


def run_report(run_dir: str) -> dict:
    from kvagent.cli.ui import print_markdown
    from kvagent.errors import KvagentError
    from kvagent.evals.report import write_report

    if not Path(run_dir).is_dir():
        raise KvagentError(
            f"report: {run_dir} is not a directory; pass the --out directory of a `kvagent eval` run"
        )
    summary = write_report(run_dir)
    print_markdown((Path(run_dir) / "report.md").read_text(encoding="utf-8"))
    return summary
