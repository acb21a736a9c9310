"""`kvagent bench serve`'s load: the workload's conversations against one OpenAI-compatible server
at a time, `concurrency` of them at once (a finished one makes room for the next), each turn one
streamed chat completion asking for exactly the recorded reply's length (`max_tokens` =
`min_tokens`, `ignore_eos`). Per turn it records time to first token, duration, and `usage`
(prompt tokens sent, the part the server already held, completion tokens); per server, wall time
and what /metrics says about KV memory (scraped before, during and after).

Servers are measured one after another, never at once: they share the machine's cores."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from kvagent.bench.progress import NoProgress
from kvagent.bench.serve_load.metrics import kv_state, kv_summary, parse_prometheus, track_peaks
from kvagent.bench.serve_load.workload import Conversation, Turn
from kvagent.errors import ConfigError


@dataclass(frozen=True)
class Target:
    url: str  # the server's root (its API at URL/v1)
    label: str | None = None  # default: what /v1/models says owns the model, and the port

    @staticmethod
    def parse(text: str) -> Target:
        """`URL` or `LABEL=URL`; a trailing /v1 is dropped."""
        label, sep, url = text.partition("=")
        if not sep or "://" in label:
            label, url = "", text
        url = url.strip().rstrip("/").removesuffix("/v1")
        parts = urlparse(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(f"url: {text!r} is not http(s)://HOST:PORT; e.g. --url http://127.0.0.1:8000")
        return Target(url=url, label=label.strip() or None)


@dataclass(frozen=True)
class LoadSettings:
    concurrency: int = 8
    temperature: float = 0.0
    seed: int = 0
    timeout_s: float = 600.0  # per request
    scrape_every_s: float = 1.0  # /metrics while the load runs (peaks)
    model: str | None = None  # default: the first model /v1/models lists

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ConfigError(f"concurrency: must be >= 1, got {self.concurrency}")
        if not self.timeout_s > 0:
            raise ConfigError(f"timeout: must be > 0 seconds, got {self.timeout_s}")


def _error_line(status: int, raw: bytes) -> str:
    try:
        msg = json.loads(raw)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        msg = raw.decode("utf-8", "replace").strip()[:200]
    return f"HTTP {status}: {str(msg).splitlines()[0] if msg else ''}"


async def _models(client: Any, target: Target) -> tuple[str, str]:
    import httpx

    try:
        r = await client.get(f"{target.url}/v1/models", timeout=30)
        r.raise_for_status()
        card = r.json()["data"][0]
        return str(card["id"]), str(card.get("owned_by") or "server")
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as e:
        raise ConfigError(
            f"url: {target.url}/v1/models did not answer with a model ({type(e).__name__}: {e}); start the "
            "server or fix --url"
        ) from None


async def _scrape(client: Any, url: str) -> dict[str, Any]:
    import httpx

    try:
        r = await client.get(f"{url}/metrics", timeout=30)
        return kv_state(parse_prometheus(r.text)) if r.status_code == 200 else {}
    except httpx.HTTPError:
        return {}


async def one_turn(client: Any, url: str, model: str, turn: Turn, settings: LoadSettings) -> dict[str, Any]:
    """One streamed request: timings from the request's start, usage from its last chunk."""
    import httpx

    n = turn.max_tokens
    body = {"model": model, "messages": turn.messages, "max_tokens": n, "min_tokens": n, "ignore_eos": True,
            "temperature": settings.temperature, "seed": settings.seed, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    rec: dict[str, Any] = {"expected_tokens": n, "expected_prompt_tokens": turn.prompt_tokens}
    start = time.perf_counter()
    first_chunk = first_text = None
    usage: dict[str, Any] = {}
    error = finish = None
    try:
        async with client.stream(
            "POST", f"{url}/v1/chat/completions", json=body, timeout=settings.timeout_s
        ) as r:
            if r.status_code != 200:
                error = _error_line(r.status_code, await r.aread())
            else:
                async for line in r.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[6:].strip()
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    if "error" in chunk:
                        error = f"stream error: {str(chunk['error'].get('message', chunk['error']))[:200]}"
                        break
                    for choice in chunk.get("choices") or []:
                        now = time.perf_counter()
                        first_chunk = first_chunk if first_chunk is not None else now
                        if first_text is None and (choice.get("delta") or {}).get("content"):
                            first_text = now
                        finish = choice.get("finish_reason") or finish
                    usage = chunk.get("usage") or usage
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        error = f"{type(e).__name__}: {str(e)[:200]}"
    end = time.perf_counter()
    first = first_text if first_text is not None else first_chunk
    if error is None and not usage:
        error = "no usage in the stream (does the server honour stream_options.include_usage?)"
    completion = int(usage.get("completion_tokens") or 0)
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens", usage.get("kv_continued_tokens"))
    rec.update(
        ok=error is None, error=error, finish_reason=finish, start=start, end=end,
        ttft_s=(first - start) if first is not None else None, duration_s=end - start,
        completion_tokens=completion, prompt_tokens=int(usage.get("prompt_tokens") or 0),
        cached_tokens=int(cached) if cached is not None else None,
    )  # fmt: skip
    if rec["ok"] and completion != n:
        rec["short"] = True  # the server stopped early despite min_tokens / ignore_eos
    return rec


async def _measure(target: Target, convs: Sequence[Conversation], settings: LoadSettings, progress,
                   result: dict[str, Any]) -> None:  # fmt: skip
    import httpx

    limits = httpx.Limits(
        max_connections=settings.concurrency + 4, max_keepalive_connections=settings.concurrency + 4
    )
    async with httpx.AsyncClient(limits=limits, timeout=settings.timeout_s) as client:
        model, owner = await _models(client, target)
        model = settings.model or model
        port = urlparse(target.url).port
        result.update(label=target.label or f"{owner}:{port}", url=target.url, model=model, owner=owner)
        # one tiny request first: a server's first forward may compile or warm up
        warm = Turn([{"role": "user", "content": "Say hi."}], 2, 0)
        w = await one_turn(client, target.url, model, warm, settings)
        if not w["ok"]:
            raise ConfigError(f"url: {target.url} refused a warm-up request ({w['error']}); check the server")
        before = await _scrape(client, target.url)
        peaks: dict[str, float] = {}
        task = progress.task(f"{result['label']}: turns", sum(len(c.turns) for c in convs))
        pending = list(range(len(convs)))[::-1]
        records: list[dict[str, Any]] = result["records"]
        t0 = time.perf_counter()

        async def worker() -> None:
            while pending:
                ci = pending.pop()
                for ti, turn in enumerate(convs[ci].turns):
                    rec = await one_turn(client, target.url, model, turn, settings)
                    rec.update(
                        conversation=convs[ci].name, turn=ti, start=rec["start"] - t0, end=rec["end"] - t0
                    )
                    records.append(rec)
                    task.advance(1)

        async def sampler() -> None:
            while True:
                track_peaks(peaks, await _scrape(client, target.url))
                await asyncio.sleep(settings.scrape_every_s)

        sampling = asyncio.ensure_future(sampler())
        try:
            await asyncio.gather(*(worker() for _ in range(min(settings.concurrency, len(convs)))))
        finally:
            sampling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampling
            task.done()
        result["wall_s"] = time.perf_counter() - t0
        after = await _scrape(client, target.url)
        track_peaks(peaks, after)
        result["kv"] = kv_summary(before, after, peaks)


def run_load(
    targets: Sequence[Target],
    convs: Sequence[Conversation],
    settings: LoadSettings,
    progress=None,
    results: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """One result per target: label, url, model, wall_s, kv (from /metrics) and the per-turn
    records. `results` is filled as the run goes, so an interrupted run's caller keeps what finished."""
    progress = progress or NoProgress()
    results = [] if results is None else results
    for target in targets:
        result: dict[str, Any] = {"url": target.url, "records": []}
        results.append(result)
        asyncio.run(_measure(target, convs, settings, progress, result))
    return results
