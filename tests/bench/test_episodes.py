import json

import pytest

from kvagent.bench.episodes import load_json_episode, normalise_message, render_tool_call
from kvagent.bench.generator import generate_episode
from kvagent.bench.sources import load_episodes
from kvagent.errors import ConfigError
from kvagent.sandbox import open_sandbox


def local_sandbox(repo):
    return open_sandbox("local", repo=repo)


def test_render_tool_call_r2e_format_both_shapes():
    flat = {"name": "execute_bash", "arguments": json.dumps({"cmd": "ls -la", "timeout": 5})}
    nested = {"id": "x", "type": "function", "function": flat}
    want = "<function=execute_bash>\n<parameter=cmd>ls -la</parameter>\n<parameter=timeout>5</parameter>\n</function>"
    assert render_tool_call(flat) == want
    assert render_tool_call(nested) == want


def test_assistant_text_gets_its_calls_appended():
    m = normalise_message(
        {
            "role": "assistant",
            "content": "Look first.",
            "tool_calls": [{"name": "search", "arguments": '{"search_term": "foo"}'}],
        }
    )
    assert (
        m["content"]
        == "Look first.\n\n<function=search>\n<parameter=search_term>foo</parameter>\n</function>"
    )
    bare = normalise_message(
        {"role": "assistant", "content": None, "tool_calls": [{"name": "finish", "arguments": "{}"}]}
    )
    assert bare["content"] == "<function=finish>\n</function>"


def test_jsonl_fixture_loads_with_rendered_calls_and_planted_fact(jsonl_file):
    eps = load_episodes([f"{jsonl_file}:first=1"])
    assert [e.name for e in eps] == ["fixture-1"]
    msgs = eps[0].messages
    assistants = [m["content"] for m in msgs if m["role"] == "assistant"]
    assert all("<function=" in a and a.endswith("</function>") for a in assistants)
    assert "<parameter=path>m1.py</parameter>" in assistants[1]  # the OpenAI-shaped call
    text = "\n".join(m["content"] for m in msgs)
    assert text.count(eps[0].probe.value) == 1
    assert len(load_episodes([f"{jsonl_file}:ids=fixture-2"])) == 1
    assert load_episodes([f"{jsonl_file}:plant=0"])[0].probe is None


def test_trajectory_json_shape(tmp_path):
    path = tmp_path / "run.traj.json"
    path.write_text(
        json.dumps(
            {
                "format": "kvagent.trajectory/1",
                "messages": [
                    {"role": "system", "content": "s"},
                    {"role": "user", "content": "u"},
                    {"role": "assistant", "content": "a"},
                    {"role": "user", "content": "obs"},
                ],
            }
        )
    )
    ep = load_json_episode(path)
    assert ep.name == "run" and ep.messages[2] == {"role": "assistant", "content": "a"}


@pytest.mark.parametrize("spec", ["nope.jsonl", "gen:seed=x", "gen:colour=red", "gen:turns=3", "README"])
def test_bad_specs_are_config_errors(spec, tmp_path):
    with pytest.raises(ConfigError):
        load_episodes([spec], open_env=local_sandbox)


def test_generator_is_deterministic_per_seed():
    a = generate_episode(seed=0, turns=11, open_env=local_sandbox)
    b = generate_episode(seed=0, turns=11, open_env=local_sandbox)
    c = generate_episode(seed=3, turns=11, open_env=local_sandbox)
    assert a.messages == b.messages and a.probe == b.probe
    assert a.messages != c.messages and a.probe.value != c.probe.value
    assert sum(m["role"] == "assistant" for m in a.messages) == 11
    observations = [m["content"] for m in a.messages if m["role"] == "user"][1:]
    # The fact is stated once, early, in real tool output; the tests really ran in the sandbox.
    assert sum(a.probe.value in o for o in observations) == 1
    assert a.probe.value in observations[2]
    assert any("Ran 7 tests in 0.000s" in o for o in observations)
    assert not any("kvagent-sbx" in o for o in observations)
