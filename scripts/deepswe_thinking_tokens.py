"""What keeping or dropping past replies' <think> costs, in Qwen3 tokens, on recorded R2E-Gym
episodes (the records of a trajectories JSONL whose assistant turns hold `</think>`).

For each episode, the tokens the model reads at its last call under three histories:
  keep   kvagent's append-only stream, every reply verbatim (history=keep-thinking)
  drop   the same stream less each past reply's thinking (history=drop-thinking: everything
         through the last </think> and the newlines after it, as a Qwen3 chat template drops it)
  r2e    R2E-Gym's own re-render: a past reply becomes only its re-serialised call block
and the sum over all calls of the tokens read (what a re-prefilling server processes in all).

    .venv/bin/python scripts/deepswe_thinking_tokens.py [FILE.jsonl]

Without FILE, the study's bundled episode file (`kvagent bench episodes build` makes it).
"""

from __future__ import annotations

import sys
from pathlib import Path

from kvagent.agent.r2egym import parse_action
from kvagent.agent.render import ChatMLRenderer
from kvagent.agent.thinking import thinking_offsets
from kvagent.bench.manifest import bundled_file
from kvagent.errors import KvagentError
from kvagent.fileio import read_jsonl
from kvagent.runtime.models import load_qwen3_tokenizer


def r2e_call_block(reply: str) -> str:
    """R2E-Gym's stored assistant content after the template dropped its thinking: the call only."""
    a = parse_action(reply)
    body = "".join(f"  <parameter={k}>{v}</parameter>\n" for k, v in a.params.items())
    return f"<function={a.name}>\n{body}</function>"


def measure(messages: list[dict], render: ChatMLRenderer) -> dict[str, int]:
    tok = render.tokenizer
    sizes = {"keep": [], "drop": [], "r2e": []}  # per message, tokens under each history
    replies = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    for i, m in enumerate(messages):
        text = m.get("content") or ""
        full = len(render.encode(f"{m['role']}\n{text}")) + 2  # <|im_start|> ... <|im_end|>
        if m["role"] != "assistant" or i == replies[-1]:
            for k in sizes:
                sizes[k].append(full)
            continue
        ids = render.encode(text)
        sizes["keep"].append(full)
        sizes["drop"].append(full - len(thinking_offsets(ids, tok)))
        sizes["r2e"].append(len(render.encode(f"assistant\n{r2e_call_block(text)}")) + 2)
    out = {}
    for k, per in sizes.items():
        out[f"{k}_last"] = sum(per[: replies[-1]])  # read by the last call
        out[f"{k}_all"] = sum(sum(per[:r]) for r in replies)  # read over all calls
    out["replies"] = len(replies)
    return out


def main(path: str) -> None:
    render = ChatMLRenderer(load_qwen3_tokenizer())
    rows = []
    for _, rec in read_jsonl(path):
        msgs = rec["messages"]
        if not any(m["role"] == "assistant" and "</think>" in (m.get("content") or "") for m in msgs):
            continue
        rows.append((rec["id"][:48], measure(msgs, render)))
    print("| episode | replies | last call: keep | drop | r2e | all calls: keep | drop | r2e |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in rows:
        print(
            f"| {name} | {r['replies']} | {r['keep_last']:,} | {r['drop_last']:,} | {r['r2e_last']:,} "
            f"| {r['keep_all']:,} | {r['drop_all']:,} | {r['r2e_all']:,} |"
        )


def episode_file(arg: str | None) -> Path:
    """FILE, or the bundled episode file (checked against its manifest); missing or stale: one line."""
    if arg and arg != "bundled":
        return Path(arg)
    try:
        return bundled_file()
    except KvagentError as e:
        raise SystemExit(str(e).replace("pass --episodes FILE.jsonl", "pass FILE.jsonl")) from None


if __name__ == "__main__":
    main(str(episode_file(sys.argv[1] if len(sys.argv) > 1 else None)))
