"""The terminal chat (ChatSession around a ChatAgent) with a scripted model: approval keys, follow-up
requests on the same token stream, Ctrl-C during a reply or a tool call, and the chat commands."""

import io
import os
import signal

import pytest
from rich.console import Console

from kvagent.agent import AgentConfig, ChatMLRenderer
from kvagent.agent.chat import DECLINED, STOPPED_DURING, STOPPED_REPLY
from kvagent.cli.chat.run import ChatSession
from kvagent.errors import ConfigError
from kvagent.runtime.config import CacheConfig
from tests.helpers import FIX_MEAN, call

VIEW = "Let me look.\n" + call("file_editor", command="view", path="/testbed/calc/__init__.py")
FINISH = call("finish", command="submit", result="Fixed the denominator.")


class Keys:
    """Scripted keypresses; records the prompts it was asked."""

    def __init__(self, keys=""):
        self.keys = list(keys)
        self.prompts = []

    def __call__(self, prompt):
        self.prompts.append(prompt)
        if not self.keys:
            raise AssertionError(f"unexpected key prompt: {prompt!r}")
        key = self.keys.pop(0)
        if isinstance(key, BaseException) or (isinstance(key, type) and issubclass(key, BaseException)):
            raise key
        return key


def make_chat(session, env, tokenizer, keys="", lines=(), **kw):
    out = io.StringIO()
    line_iter = iter(lines)

    def read_line(prompt):
        try:
            item = next(line_iter)
        except StopIteration:
            raise EOFError from None
        if isinstance(item, type) and issubclass(item, BaseException):
            raise item
        return item

    chat = ChatSession(
        session,
        env,
        tokenizer,
        kw.pop("config", AgentConfig()),
        console=Console(file=out, width=100, color_system=None),
        read_line=read_line,
        read_key=Keys(keys) if isinstance(keys, str | list) else keys,
        cache=CacheConfig(policy="random", budget=256, buffer=32),
        **kw,
    )
    return chat, out


def check_stream(chat, session, tokenizer):
    assert session.logical_length == len(session.history)
    assert tokenizer.decode(session.history) == ChatMLRenderer.transcript(chat.agent.messages)


def test_confirm_mode_runs_on_y_declines_on_n_and_follow_ups_share_the_stream(scripted, fake_env, tokenizer):
    session = scripted([VIEW, FIX_MEAN, FIX_MEAN, FINISH, call("execute_bash", cmd="echo again"), FINISH])
    chat, out = make_chat(session, fake_env, tokenizer, keys="ynyy")

    assert chat.ask("mean([1, 2, 3]) returns 1.5 instead of 2.") == "submitted"
    check_stream(chat, session, tokenizer)
    # y -> viewed, n -> the first edit never ran, y -> the second edit ran; finish needs no key.
    assert [c[0] for c in fake_env.calls] == ["file_editor", "file_editor", "finish"]
    assert fake_env.calls[1][1]["command"] == "str_replace"
    assert chat.agent.turns[1].observation.startswith(DECLINED)
    assert chat.agent.messages[5] == {"role": "user", "content": chat.agent.turns[1].observation}
    assert len(chat.read_key.prompts) == 3 and all("[y]es" in p for p in chat.read_key.prompts)
    text = out.getvalue()
    assert (
        "step 1: file_editor" in text and "step 2: file_editor" in text and "Fixed the denominator." in text
    )
    assert "cache " in text and "evicted" in text  # the status line

    history_before = list(session.history)
    assert chat.ask("Now also echo something.") == "submitted"
    check_stream(chat, session, tokenizer)
    assert session.history[: len(history_before)] == history_before  # append-only across requests
    follow = chat.agent.messages[9]
    assert follow["role"] == "user" and follow["content"].startswith("Now also echo something.")
    assert follow["content"].endswith("Steps Remaining: 100")  # step counting restarts per request
    assert chat.agent.messages[:2][0]["role"] == "system"
    assert "+    return total / len(values)" in fake_env.diff()
    assert session.appends[0] > session.appends[1]  # the prompt once, then only the new turns


def test_q_quits_without_running_the_call(scripted, fake_env, tokenizer):
    chat, _ = make_chat(scripted([VIEW]), fake_env, tokenizer, keys="xq")  # an unknown key asks again
    assert chat.ask("look at calc") == "quit"
    assert fake_env.calls == [] and len(chat.read_key.prompts) == 2


def test_yolo_mode_never_asks(scripted, fake_env, tokenizer):
    chat, _ = make_chat(scripted([VIEW, FINISH]), fake_env, tokenizer, keys=Keys(), approval="yolo")
    assert chat.ask("look at calc") == "submitted"
    assert [c[0] for c in fake_env.calls] == ["file_editor", "finish"]


def test_ctrl_c_stops_a_reply_and_keeps_its_tokens_in_the_stream(scripted, fake_env, tokenizer):
    session = scripted([VIEW, FINISH])
    chat, out = make_chat(session, fake_env, tokenizer)

    def press_ctrl_c(n):
        if n == 4:  # a real SIGINT, as the terminal sends it, while the model samples
            os.kill(os.getpid(), signal.SIGINT)

    session.after_token = press_ctrl_c
    old_handler = signal.getsignal(signal.SIGINT)
    assert chat.ask("look at calc") == "interrupted"
    assert signal.getsignal(signal.SIGINT) is old_handler  # the chat's handler is gone again
    turn = chat.agent.turns[-1]
    assert turn.finish_reason == "interrupted" and 4 <= turn.reply_tokens <= 5 and fake_env.calls == []
    check_stream(chat, session, tokenizer)
    assert "interrupted" in out.getvalue()

    # The rest of the stopped reply is what the model "would have said": it is gone; go on.
    session.after_token = None
    assert chat.ask("never mind, just submit") == "submitted"
    check_stream(chat, session, tokenizer)
    follow = chat.agent.messages[3]
    assert follow["content"].startswith(STOPPED_REPLY + "\n\nnever mind, just submit")


def test_ctrl_c_during_a_tool_call_returns_to_the_prompt(scripted, fake_env, tokenizer):
    run_tool = fake_env.run_tool

    def slow_tool(name, params, timeout=90):
        if name == "execute_bash":
            raise KeyboardInterrupt  # what the raising SIGINT handler does inside the sandbox call
        return run_tool(name, params, timeout)

    fake_env.run_tool = slow_tool
    session = scripted([call("execute_bash", cmd="sleep 100"), FINISH])
    chat, _ = make_chat(session, fake_env, tokenizer, approval="yolo")
    assert chat.ask("run the slow thing") == "interrupted"
    assert chat.agent.turns[0].observation == STOPPED_DURING and not chat.agent.turns[0].fed
    assert chat.ask("ok, submit") == "submitted"
    check_stream(chat, session, tokenizer)
    assert chat.agent.messages[3]["content"].startswith(STOPPED_DURING + "\n\nok, submit")


def test_per_request_step_limit_and_the_unfed_output_reaches_the_next_request(scripted, fake_env, tokenizer):
    replies = [call("execute_bash", cmd="echo one"), call("execute_bash", cmd="echo two"), FINISH]
    session = scripted(replies)
    chat, out = make_chat(session, fake_env, tokenizer, approval="yolo", config=AgentConfig(max_steps=2))
    assert chat.ask("echo things") == "step_limit"
    assert "step limit (2 per request)" in out.getvalue()
    assert chat.ask("go on") == "submitted"
    follow = chat.agent.messages[5]["content"]
    assert "two" in follow and follow.index("two") < follow.index("go on")
    assert "Steps Remaining: 2\n" in follow  # counted afresh for this request
    check_stream(chat, session, tokenizer)


def test_commands_diff_save_stats_help_and_the_patch_offer(scripted, fake_env, tokenizer, tmp_path):
    session = scripted([FIX_MEAN, FINISH])
    saved = tmp_path / "out" / "fix.patch"
    lines = ["/help", "/diff", "/stats", "/nope", "/save", "fix it", "/diff", f"/save {saved}", "", "/quit"]
    keys = Keys(["y", "n"])  # y: run the edit; n: do not show the patch at the end
    chat, out = make_chat(
        session, fake_env, tokenizer, keys=keys, lines=[*lines, str(tmp_path / "end.patch")]
    )
    chat.run()
    text = out.getvalue()
    assert "/save FILE" in text and "no changes yet" in text and "unknown command /nope" in text
    assert "usage: /save FILE" in text and "requests 0 | steps 0" in text
    assert "+    return total / len(values)" in text  # /diff after the fix
    assert saved.read_text() == fake_env.diff() and "+    return total / len(values)" in saved.read_text()
    assert (tmp_path / "end.patch").read_text() == saved.read_text()
    assert "changed 1 file(s)" in keys.prompts[-1]


def test_eof_and_ctrl_c_at_the_prompt(scripted, fake_env, tokenizer):
    chat, out = make_chat(scripted([]), fake_env, tokenizer, lines=[KeyboardInterrupt])
    chat.run()  # Ctrl-C at the prompt only prints a hint; EOF then ends the chat
    assert "type /quit to leave" in out.getvalue()


def test_bad_approval_mode(scripted, fake_env, tokenizer):
    with pytest.raises(ConfigError, match="approval: got 'ask'; choose one of confirm, yolo"):
        make_chat(scripted([]), fake_env, tokenizer, approval="ask")


def test_sigterm_at_the_prompt_ends_the_chat(scripted, fake_env, tokenizer):
    """SIGTERM / SIGHUP (cli/signals.py raises Terminated) end the chat, so `kill` works on an idle
    chat and its sandbox is closed; Ctrl-C at the prompt only prints a hint (test above)."""
    from kvagent.errors import Terminated

    chat, out = make_chat(scripted([]), fake_env, tokenizer, lines=[Terminated, "/quit"])
    with pytest.raises(Terminated):
        chat.run()
    assert "type /quit to leave" not in out.getvalue()


def test_sigterm_during_a_tool_call_ends_the_chat_not_just_the_request(scripted, fake_env, tokenizer):
    from kvagent.errors import Terminated

    def killed(name, params, timeout=90):
        raise Terminated("SIGTERM")

    fake_env.run_tool = killed
    chat, _ = make_chat(
        scripted([call("execute_bash", cmd="sleep 100")]), fake_env, tokenizer, approval="yolo"
    )
    with pytest.raises(Terminated):
        chat.ask("run the slow thing")


def test_the_stop_signals_raise_terminated(monkeypatch):
    from kvagent.cli import signals
    from kvagent.errors import Terminated

    with pytest.raises(Terminated, match="SIGTERM"):
        signals._interrupt(signal.SIGTERM, None)
    assert issubclass(Terminated, KeyboardInterrupt)  # `with` blocks and the CLI treat it as Ctrl-C
