from types import SimpleNamespace

from kvagent.agent.observation import FINISHED, steps_notice, tool_observation, truncate_lines


def lines(n):
    return "\n".join(f"line {i}" for i in range(1, n + 1))


def test_eighty_lines_are_kept_whole():
    assert truncate_lines(lines(80)) == lines(80)


def test_longer_output_keeps_first_and_last_forty():
    out = truncate_lines(lines(200)).split("\n")
    assert len(out) == 81
    assert out[:40] == [f"line {i}" for i in range(1, 41)]
    assert out[41:] == [f"line {i}" for i in range(161, 201)]
    assert "120 lines truncated" in out[40]


def test_bash_observation_passes_the_script_header_and_caps_length():
    body = "Exit code: 1\nExecution output of [execute_bash]:\n[STDOUT]\n\n" + lines(300)
    obs = tool_observation("execute_bash", SimpleNamespace(exit_code=1, output=body, timed_out=False), 90)
    assert obs.startswith("Exit code: 1\nExecution output of [execute_bash]:")
    assert len(obs.split("\n")) == 81


def test_bash_observation_adds_a_missing_header_and_timeout_note():
    obs = tool_observation(
        "execute_bash", SimpleNamespace(exit_code=-1, output="partial\n", timed_out=True), 90
    )
    assert obs.split("\n")[:3] == ["Exit code: -1", "Execution output of [execute_bash]:", "partial"]
    assert "timed out after 90 seconds" in obs


def test_other_tools_and_finish():
    view = tool_observation(
        "file_editor", SimpleNamespace(exit_code=0, output="     1\tx = 1\n", timed_out=False), 90
    )
    assert view == "Execution output of [file_editor]:\n     1\tx = 1"
    assert (
        tool_observation("finish", SimpleNamespace(exit_code=0, output="", timed_out=False), 90) == FINISHED
    )


def test_steps_notice_and_submit_order():
    assert steps_notice(0, 100, 40, 3) == "Steps Remaining: 100"
    assert steps_notice(40, 100, 40, 3) == "Steps Remaining: 60"
    past_soft = steps_notice(41, 100, 40, 3)
    assert past_soft.startswith("Steps Remaining: 59\n") and "Submit your answer now" in past_soft
    assert "Submit your answer now" in steps_notice(8, 10, None, 3)
    assert "Submit" not in steps_notice(6, 10, None, 3)
