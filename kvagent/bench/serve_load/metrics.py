"""What a server's Prometheus /metrics says about its KV memory, read the same way for kvagent serve
(names in docs/serve.md) and vLLM (`vllm:*`). The text format is parsed here (a few lines) so the
load generator needs no Prometheus client."""

from __future__ import annotations

import re
from typing import Any

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> dict[str, float]:
    """`name{k="v",...}` (labels sorted) -> value, histogram buckets left out."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m or m.group(1).endswith("_bucket"):
            continue
        try:
            value = float(m.group(4))
        except ValueError:
            continue
        labels = sorted(_LABEL.findall(m.group(3) or ""))
        key = m.group(1) + ("{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}" if labels else "")
        out[key] = value
    return out


def _get(samples: dict[str, float], name: str) -> float | None:
    return samples.get(name)


def _sum(samples: dict[str, float], name: str) -> float | None:
    hits = [v for k, v in samples.items() if k == name or k.startswith(name + "{")]
    return sum(hits) if hits else None


def _label(samples: dict[str, float], name: str, label: str) -> str | None:
    for k in samples:
        if k.startswith(name + "{"):
            m = re.search(rf'{label}="([^"]*)"', k)
            if m:
                return m.group(1)
    return None


def kv_state(samples: dict[str, float]) -> dict[str, Any]:
    """The KV figures one scrape gives: usage (0..1 of the server's KV memory, where it has one),
    bytes held, capacity, sessions/requests and the counters of what memory pressure cost
    (vLLM's preemptions, kvagent's dropped sessions and evicted entries). Absent figures are left out."""
    out: dict[str, Any] = {}
    if any(k.startswith("kvagent_") for k in samples):
        out["engine"] = "kvagent"
        held, limit = _get(samples, "kvagent_kv_bytes"), _get(samples, "kvagent_kv_memory_limit_bytes")
        out["kv_bytes"] = held
        if limit:
            out["kv_limit_bytes"] = limit
            out["kv_usage"] = held / limit if held is not None else None
        out["live_sessions"] = _get(samples, "kvagent_live_sessions")
        out["running"] = _get(samples, "kvagent_requests_running")
        out["waiting"] = _get(samples, "kvagent_queue_waiting")
        out["dropped_sessions"] = _sum(samples, "kvagent_sessions_dropped_total")
        out["evicted_entries"] = _get(samples, "kvagent_evicted_entries_total")
        out["eviction_rounds"] = _get(samples, "kvagent_eviction_rounds_total")
        out["batch_size_mean"] = _get(samples, "kvagent_batch_size_mean")
    elif any(k.startswith("vllm:") for k in samples):
        out["engine"] = "vllm"
        usage = _sum(samples, "vllm:kv_cache_usage_perc")
        out["kv_usage"] = usage if usage is not None else _sum(samples, "vllm:gpu_cache_usage_perc")
        blocks = _label(samples, "vllm:cache_config_info", "num_gpu_blocks")
        size = _label(samples, "vllm:cache_config_info", "block_size")
        if blocks and size and blocks.isdigit() and size.isdigit():
            out["kv_capacity_tokens"] = int(blocks) * int(size)
        out["running"] = _sum(samples, "vllm:num_requests_running")
        out["waiting"] = _sum(samples, "vllm:num_requests_waiting")
        out["preemptions"] = _sum(samples, "vllm:num_preemptions_total")
        out["prefix_cache_queries"] = _sum(samples, "vllm:prefix_cache_queries_total")
        out["prefix_cache_hits"] = _sum(samples, "vllm:prefix_cache_hits_total")
    return {k: v for k, v in out.items() if v is not None}


COUNTERS = (
    "dropped_sessions", "evicted_entries", "eviction_rounds", "preemptions", "prefix_cache_queries",
    "prefix_cache_hits",
)  # fmt: skip
GAUGES = ("kv_usage", "kv_bytes", "running", "waiting", "live_sessions")


def kv_summary(before: dict[str, Any], after: dict[str, Any], peaks: dict[str, float]) -> dict[str, Any]:
    """One run's KV figures: counters as the run's increase, gauges at their sampled peak, the rest
    (engine, limits, capacity, mean batch) as the last scrape has them."""
    out: dict[str, Any] = {}
    for k, v in after.items():
        if k in COUNTERS:
            out[k] = v - before.get(k, 0)
        elif k not in GAUGES:
            out[k] = v
    for k, v in peaks.items():
        out[f"peak_{k}"] = v
    return out


def track_peaks(peaks: dict[str, float], state: dict[str, Any]) -> None:
    for k in GAUGES:
        v = state.get(k)
        if isinstance(v, int | float):
            peaks[k] = max(peaks.get(k, v), v)
