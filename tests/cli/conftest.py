"""Fixtures the command-line tests share."""

from __future__ import annotations

import json

import pytest

from kvagent.evals.datasets import Instance
from kvagent.testing import CALC_PY, git_repo


@pytest.fixture()
def mini(tmp_path):
    """(dataset file, repos dir): one instance, fixture__calc-1, with its checkout under repos/."""
    repos = tmp_path / "repos"
    git_repo(repos / "fixture__calc-1", {"calc.py": CALC_PY})
    inst = Instance(
        "fixture__calc-1", "fixture/calc", "HEAD", "add() subtracts", "diff --git a/t b/t\n", ["t"], []
    )
    dataset = tmp_path / "mini.jsonl"
    dataset.write_text(json.dumps(inst.to_record()) + "\n")
    return dataset, repos
