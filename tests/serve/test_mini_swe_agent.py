"""A real client no one here wrote: mini-swe-agent (from the registry) runs one episode of the calc
fixture instance through `kvagent serve` with SmolLM2, over litellm's OpenAI-compatible provider,
with tool calling and its commands in a bubblewrap sandbox without network. Success is not asked
of a 135M model; the episode must end, and its trajectory must show every call after the first
continuing the one session."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kvagent.testing import calc_record


def _bwrap() -> str:
    path = shutil.which("bwrap")
    if path is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("CI=true but bubblewrap is missing (scripts/services.sh installs it)")
        pytest.skip("bubblewrap (bwrap) is not installed; apt-get install bubblewrap to run this test")
    return path


def _start_server() -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "kvagent", "serve", "--model", "smollm2", "--port", "0", "--max-batch", "1",
           "--device", "cpu", "--log-level", "info", "--drain-timeout", "5"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:  # model loading prints progress first
        if "at http://127.0.0.1:" in line:
            return proc, line.split("at ", 1)[1].split(" ", 1)[0]
    proc.wait()
    pytest.fail(f"kvagent serve exited {proc.returncode} before listening")


@pytest.mark.slow
def test_mini_swe_agent_episode_continues_one_session(tmp_path, monkeypatch):
    bwrap = _bwrap()
    monkeypatch.setenv("MSWEA_GLOBAL_CONFIG_DIR", str(tmp_path / "mswea"))  # not the user's ~/.config
    monkeypatch.setenv("MSWEA_SILENT_STARTUP", "1")
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of litellm's price list
    # mini-swe-agent retries a failed call itself (tenacity, 10 attempts, whatever litellm's
    # num_retries says): a retry after a failed request starts a new session, and the failure
    # would only show as extra sessions. One attempt: a failed call fails the test with its error.
    monkeypatch.setenv("MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT", "1")
    record = calc_record(tmp_path / "repos", "fixture__calc-1")
    repo = tmp_path / "repos" / record["instance_id"]
    proc, base_url = _start_server()
    try:
        import minisweagent
        from minisweagent.agents.default import DefaultAgent
        from minisweagent.environments.extra.bubblewrap import (
            BubblewrapEnvironment,
            BubblewrapEnvironmentConfig,
        )
        from minisweagent.models.litellm_model import LitellmModel

        config = yaml.safe_load((Path(minisweagent.package_dir) / "config" / "mini.yaml").read_text())
        model = LitellmModel(
            model_name="openai/smollm2",  # litellm's OpenAI-compatible provider
            # no hidden retries: a retried call would start a second session and blur what is checked
            model_kwargs={
                "api_base": base_url,
                "api_key": "unused",
                "max_tokens": 32,
                "temperature": 0.0,
                "timeout": 3000,
                "num_retries": 0,
            },
            cost_tracking="ignore_errors",
            observation_template=config["model"]["observation_template"],
            format_error_template=config["model"]["format_error_template"],
        )
        sandbox = [*BubblewrapEnvironmentConfig().wrapper_args, "--unshare-net"]
        env = BubblewrapEnvironment(cwd=str(repo), executable=bwrap, wrapper_args=sandbox, timeout=30)
        traj = tmp_path / "calc.traj.json"
        agent = DefaultAgent(model, env, **{**config["agent"], "step_limit": 3, "output_path": traj})
        result = agent.run(record["problem_statement"])
        env.cleanup()
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    assert result["exit_status"], result  # the episode ended (LimitsExceeded, a format error, or a submit)
    messages = json.loads(traj.read_text())["messages"]
    responses = [
        m["extra"]["response"] for m in messages if isinstance(m.get("extra", {}).get("response"), dict)
    ]
    assert len(responses) >= 2, f"only {len(responses)} model calls in the trajectory"
    kv = [r["kvagent"] for r in responses]
    usage = [r["usage"] for r in responses]
    calls = [(k["session"], k["status"], k["reason"], k["divergence"]) for k in kv]
    log = "\n".join(out.splitlines()[-60:])  # the server's log, a line a request
    assert len({k["session"] for k in kv}) == 1, (
        f"calls (session, status, reason, divergence): {calls}\n{log}"
    )
    assert kv[0]["status"] == "new" and all(k["status"] == "continued" for k in kv[1:]), f"{calls}\n{log}"
    for u in usage[1:]:
        assert u["kv_continued_tokens"] > 0 and u["kv_appended_tokens"] < u["prompt_tokens"], u
        assert u["prompt_tokens_details"]["cached_tokens"] == u["kv_continued_tokens"]
