import json

import pytest

from kvagent.agent import (
    AgentConfig,
    EpisodeResult,
    Turn,
    iter_trajectories,
    load_trajectory,
    write_trajectory,
)
from kvagent.agent.trajectory import FORMAT, write_json_atomic
from kvagent.errors import KvagentError


def result(status="submitted"):
    turn = Turn(step=1, reply="r", reply_tokens=3, finish_reason="stop", call={"name": "finish", "params": {}},
                observation="<<< Finished >>>", logical_length=120, cache_entries=64, cache={"rounds": 2})  # fmt: skip
    return EpisodeResult(
        status, "diff --git a/x b/x\n", [{"role": "system", "content": "s"}], [turn], AgentConfig()
    )


def test_round_trip_and_no_temp_files_left(tmp_path):
    path = write_trajectory(tmp_path / "a" / "one.traj.json", result(), {"instance_id": "i-1"})
    data = load_trajectory(path)
    assert data["format"] == FORMAT and data["exit_status"] == "submitted" and data["steps"] == 1
    assert data["turns"][0]["cache_entries"] == 64 and data["turns"][0]["cache"] == {"rounds": 2}
    assert data["meta"] == {"instance_id": "i-1"} and data["config"]["temperature"] == 1.0
    assert sorted(p.name for p in path.parent.iterdir()) == ["one.traj.json"]


def test_a_failed_write_keeps_the_previous_file(tmp_path):
    path = write_json_atomic(tmp_path / "x.traj.json", {"format": FORMAT, "n": 1})
    with pytest.raises(TypeError):
        write_json_atomic(path, {"format": FORMAT, "bad": object()})
    assert json.loads(path.read_text()) == {"format": FORMAT, "n": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["x.traj.json"]


def test_loader_errors_are_one_line_and_name_the_file(tmp_path):
    with pytest.raises(KvagentError, match="does not exist"):
        load_trajectory(tmp_path / "missing.traj.json")
    (tmp_path / "bad.traj.json").write_text("{oops")
    with pytest.raises(KvagentError, match="not valid JSON"):
        load_trajectory(tmp_path / "bad.traj.json")
    (tmp_path / "other.json").write_text("{}")
    with pytest.raises(KvagentError, match="not a kvagent trajectory"):
        load_trajectory(tmp_path / "other.json")


def test_iter_trajectories_finds_runs_in_order(tmp_path):
    write_trajectory(tmp_path / "b" / "2.traj.json", result("step_limit"))
    write_trajectory(tmp_path / "a" / "1.traj.json", result())
    (tmp_path / "notes.json").write_text("{}")
    assert [d["exit_status"] for _, d in iter_trajectories(tmp_path)] == ["submitted", "step_limit"]
    with pytest.raises(KvagentError, match="not a directory"):
        list(iter_trajectories(tmp_path / "nope"))
