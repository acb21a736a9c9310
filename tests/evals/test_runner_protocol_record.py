"""An eval run record names the graded patch (R2E-Gym's rule under --scaffold r2egym) and the
sampling the episode used, with where each value came from (the model's generation_config.json)."""

import contextlib
import json
from types import SimpleNamespace

from transformers import GenerationConfig

from kvagent.agent import AgentConfig
from kvagent.evals.datasets import Instance
from kvagent.evals.runner import EvalRunner, plan_runs
from kvagent.testing import ScriptedEngine
from tests.helpers import SUBMIT, call

EDIT = call("file_editor", command="str_replace", path="/testbed/a.py", old_str="1", new_str="2")
DIFF = "".join(
    f"diff --git a/{p} b/{p}\n--- a/{p}\n+++ b/{p}\n@@ -1 +1 @@\n-1\n+2\n" for p in ("a.py", "notes.md")
)


class Env:
    workdir = "/testbed"

    def run_tool(self, name, params, timeout=90):
        from kvagent.sandbox import Result

        return Result(0, "done\n")

    def diff(self):
        return DIFF


class ModelEngine(ScriptedEngine):
    """Sessions whose engine's model has a generation config, as Engine's do."""

    def __init__(self, tokenizer, generation):
        super().__init__(tokenizer, lambda config: [EDIT, SUBMIT])
        self.model = SimpleNamespace(generation_config=generation)

    def session(self, config):
        s = super().session(config)
        s.engine = self
        return s


def run(tokenizer, tmp_path, config):
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "generation_config.json").write_text(json.dumps({"top_p": 0.9, "top_k": 30}))
    inst = Instance("x__y-1", "x/y", "0" * 40, "bug", test_patch="", FAIL_TO_PASS=[], PASS_TO_PASS=[])
    runner = EvalRunner(
        run_dir=tmp_path / "run",
        engine=ModelEngine(tokenizer, GenerationConfig.from_pretrained(str(tmp_path / "g"))),
        instances={inst.instance_id: inst},
        open_env=lambda _inst: contextlib.nullcontext(Env()),
        agent_config=config,
    )
    (record,) = runner.run(plan_runs([inst.instance_id], ["full"], ["persistent"], [None], [3]))
    return record


def test_r2egym_record_names_its_patch_rule_and_sampling(tokenizer, tmp_path):
    record = run(tokenizer, tmp_path, AgentConfig(scaffold="r2egym", top_k=5))
    assert record["patch_rule"] == "r2egym"
    assert "a.py" in record["model_patch"] and "notes.md" not in record["model_patch"]
    s = record["sampling"]
    assert (s["temperature"], s["top_p"], s["top_k"], s["seed"]) == (1.0, 0.9, 5, 3)
    assert s["source"] == {"temperature": "flag", "top_p": "generation_config.json", "top_k": "flag"}
    assert s["generation_config"] == {"top_p": 0.9, "top_k": 30}


def test_kvagent_record_grades_the_whole_diff(tokenizer, tmp_path):
    record = run(tokenizer, tmp_path, AgentConfig())
    assert record["patch_rule"] == "full" and record["model_patch"] == DIFF
