"""`kvagent bench serve`: build the replayed workload (episodes cut into turns, lengths in the served
model's tokens), run it against each --url one after another with a progress bar, and write
serve.json / serve.md / serve.png (partial results kept on Ctrl-C)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvagent.errors import ConfigError


def load_tokenizer(name: str):
    """The tokenizer a served model counts with: `smollm2` (the bundled model's HF directory), a tiny
    test model's (the bundled Qwen3 tokenizer), or any local directory / hub id transformers takes."""
    from transformers import AutoTokenizer

    from kvagent.runtime import models

    if name == "smollm2":
        return AutoTokenizer.from_pretrained(str(models.smollm2_dir()))
    if name in models.TINY_MODELS:
        return models.load_qwen3_tokenizer()
    try:
        return AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise ConfigError(
            f"tokenizer: cannot load {name!r} ({first}); use smollm2 or a local model directory"
        ) from None


def counters(tokenizer) -> tuple[Any, Any]:
    """Prompt and reply lengths as a server renders them: the chat template, no added special tokens."""

    def count_prompt(messages: list[dict[str, str]]) -> int:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return len(tokenizer.encode(text, add_special_tokens=False))

    def count_text(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    return count_prompt, count_text


def _write(out: Path, rep: dict[str, Any]) -> None:
    from kvagent.bench.serve_load.report import markdown, plot
    from kvagent.fileio import atomic_write_json, atomic_write_text

    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "serve.json", rep)
    atomic_write_text(out / "serve.md", markdown(rep))
    if any(s["per_turn"] for s in rep["servers"]):
        plot(rep, out / "serve.png")


def run_serve_bench(
    *, urls: list[str], episodes: list[str], concurrency: int, conversations: int | None, turns: int,
    max_context: int, max_reply: int, clip_chars: int | None, tokenizer: str, model_name: str | None,
    temperature: float, seed: int, timeout: float, out: str, quiet: bool, fresh: bool = True,
) -> dict[str, Any]:  # fmt: skip
    import secrets
    import sys

    from kvagent.bench.serve_load.report import report
    from kvagent.bench.serve_load.run import LoadSettings, Target, run_load
    from kvagent.bench.serve_load.workload import Limits, build_workload, workload_facts
    from kvagent.bench.sources import load_episodes
    from kvagent.bench.study.run import clip_messages
    from kvagent.cli.common import check_out_dir
    from kvagent.cli.ui import Bars, print_markdown

    if not urls:
        raise ConfigError("url: none given; pass --url http://127.0.0.1:8000 (repeat it to compare servers)")
    targets = [Target.parse(u) for u in urls]
    settings = LoadSettings(concurrency=concurrency, temperature=temperature, seed=seed, timeout_s=timeout,
                            model=model_name)  # fmt: skip
    limits = Limits(max_turns=turns, max_context=max_context, max_reply=max_reply)
    if not 0 <= temperature <= 100:
        raise ConfigError(f"temperature: must be in [0, 100], got {temperature}")
    outp = check_out_dir(out)
    eps = load_episodes(episodes)
    if clip_chars:
        eps = [clip_messages(e, clip_chars) for e in eps]
    count_prompt, count_text = counters(load_tokenizer(tokenizer))
    tag = f"[run {secrets.token_hex(4)}]" if fresh else ""  # see serve_workload: every run starts cold
    convs = build_workload(eps, count_prompt, count_text, limits, conversations or concurrency, tag)
    facts = workload_facts(convs)
    run_settings = {"concurrency": concurrency, "temperature": temperature, "seed": seed,
                    "max_turns": turns, "max_context": max_context, "max_reply": max_reply,
                    "clip_chars": clip_chars, "episodes": episodes, "tokenizer": tokenizer, "tag": tag}  # fmt: skip
    results: list[dict[str, Any]] = []
    try:
        with Bars(enabled=not quiet) as bars:
            run_load(targets, convs, settings, progress=bars, results=results)
    except KeyboardInterrupt:
        if any(r["records"] for r in results):
            _write(outp, {**report(results, facts, run_settings), "interrupted": True})
            print(f"kvagent: the turns measured so far are in {outp / 'serve.json'}", file=sys.stderr)
        raise
    rep = report(results, facts, run_settings)
    _write(outp, rep)
    print_markdown((outp / "serve.md").read_text(encoding="utf-8"))
    print(f"wrote {outp / 'serve.json'}, serve.md, serve.png")
    return rep
