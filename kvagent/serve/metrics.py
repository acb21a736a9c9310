"""The server's Prometheus metrics (GET /metrics), one registry per app. Counters of work are
incremented as requests finish; the state (sessions, KV bytes, queue, batching) is read when
scraped. Every name is documented in docs/serve.md, which a load generator reads them by."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from kvagent.runtime.step import EAGER_REASONS

START_REASONS = ("new", "busy", "dropped", "diverged")
DROP_REASONS = ("kv_memory", "max_sessions", "unreadable", "lost")
PLACES = ("host", "disk")  # where an idle session moves out to (--swap-space, --session-dir)
DIVERGENCE = ("none", "reply", "deeper")
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 120, 300, 600)


class Metrics:
    def __init__(self, state: Callable[[], dict[str, Any]]) -> None:
        """`state()` -> the live numbers: sessions, kv bytes, queue, batcher counters (see collect)."""
        self.registry = r = CollectorRegistry()
        self.requests = Counter(
            "kvagent_requests",
            "Requests answered, by endpoint and HTTP status.",
            ["endpoint", "status"],
            registry=r,
        )
        self.rejected = Counter(
            "kvagent_requests_rejected",
            "Requests refused for load: queue_full or draining.",
            ["reason"],
            registry=r,
        )
        self.disconnects = Counter(
            "kvagent_client_disconnects", "Requests whose client left before the reply ended.", registry=r
        )
        tokens = {
            "prompt_tokens": "Prompt tokens of requests (continued + appended).",
            "continued_tokens": "Prompt tokens a live session already held (not fed again).",
            "appended_tokens": "Prompt tokens fed to a session.",
            "rewound_tokens": "Tokens taken back off sessions' streams (Session.rewind) before appending.",
            "reprefilled_tokens": "Appended tokens this server had fed before for the same conversation.",
            "prefill_tokens": "Tokens run through prefill forwards (reprefill mode counts the history again).",
            "decode_tokens": "Tokens run through decode steps.",
            "generation_tokens": "Completion tokens sampled.",
            "eviction_rounds": "Eviction rounds run (one round = every layer that was due).",
            "evicted_entries": "Cache entries evicted, summed over layers and KV heads.",
        }
        self.tokens = {k: Counter(f"kvagent_{k}", doc, registry=r) for k, doc in tokens.items()}
        self.continuations = Counter(
            "kvagent_session_continuations",
            "Requests that continued a live session, by where their prompt left its stream: none (it "
            "extended it), reply (inside the newest reply), deeper (before it).",
            ["divergence"],
            registry=r,
        )
        for d in DIVERGENCE:
            self.continuations.labels(d)
        for reason in ("queue_full", "draining"):
            self.rejected.labels(reason)
        self.ttft = Histogram(
            "kvagent_time_to_first_token_seconds", "From request to its first sampled token.",
            buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.duration = Histogram(
            "kvagent_request_duration_seconds",
            "From request to its last token.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        r.register(_StateCollector(state))

    def count(self, usage: dict[str, int], stats_delta: dict[str, int], divergence: str | None) -> None:
        t = self.tokens
        for key in (
            "prompt_tokens",
            "continued_tokens",
            "appended_tokens",
            "rewound_tokens",
            "reprefilled_tokens",
        ):
            t[key].inc(usage[f"kv_{key}"] if key != "prompt_tokens" else usage["prompt_tokens"])
        t["generation_tokens"].inc(usage["completion_tokens"])
        for key in ("prefill_tokens", "decode_tokens", "eviction_rounds", "evicted_entries"):
            t[key].inc(stats_delta[key])
        if divergence is not None:
            self.continuations.labels(divergence).inc()


class _StateCollector:
    def __init__(self, state: Callable[[], dict[str, Any]]) -> None:
        self.state = state

    def collect(self):
        s = self.state()
        gauges = {
            "kvagent_live_sessions": ("Sessions held (idle or serving).", s["live"]),
            "kvagent_busy_sessions": ("Sessions serving a request now.", s["busy"]),
            "kvagent_kv_bytes": (
                "KV cache bytes held by live sessions (as of their last request).",
                s["kv_bytes"],
            ),
            "kvagent_kv_memory_limit_bytes": ("--kv-memory in bytes (0: no limit).", s["kv_memory"] or 0),
            "kvagent_queue_waiting": ("Requests admitted and waiting for a slot.", s["waiting"]),
            "kvagent_requests_running": ("Requests being served now.", s["running"]),
            "kvagent_queue_capacity": ("Requests admitted at most (running + waiting).", s["capacity"]),
            "kvagent_max_batch": ("Sessions one forward can join (--max-batch).", s["max_batch"]),
            "kvagent_batch_size_mean": (
                "Mean sessions per packed forward since start (batch_rows / batch_forwards; 1 without batching).",
                s["batch_rows"] / s["batch_forwards"] if s["batch_forwards"] else 1.0,
            ),
        }
        for name, (doc, value) in gauges.items():
            yield GaugeMetricFamily(name, doc, value=value)
        yield CounterMetricFamily(
            "kvagent_batch_forwards", "Packed forwards the batcher ran.", s["batch_forwards"]
        )
        yield CounterMetricFamily(
            "kvagent_batch_rows", "Session chunks those forwards served.", s["batch_rows"]
        )
        yield CounterMetricFamily(
            "kvagent_static_steps",
            "Forwards the static decode step ran (decode tokens of sessions in one pool block); the "
            "rest ran the eager forward.",
            s["static_steps"],
        )
        eager = CounterMetricFamily(
            "kvagent_eager_forwards",
            "Forwards the eager forward ran, by why the static decode step did not take them "
            "(docs/architecture.md: prefill, private, mixed_block, outgrown, mode).",
            labels=["reason"],
        )
        for reason in EAGER_REASONS:
            eager.add_metric([reason], s["eager_forwards"].get(reason, 0))
        yield eager
        started = CounterMetricFamily(
            "kvagent_sessions_started",
            "Sessions started, by why no live one was continued: new, busy (it was serving another "
            "request), dropped (it had been dropped for memory), diverged (the prompt was its "
            "whole first append, e.g. a completion prompt again: nothing to rewind to).",
            labels=["reason"],
        )
        for reason in START_REASONS:
            started.add_metric([reason], s["started"].get(reason, 0))
        yield started
        dropped = CounterMetricFamily(
            "kvagent_sessions_dropped", "Idle sessions dropped, least recently used first.", labels=["reason"]
        )
        for reason in DROP_REASONS:
            dropped.add_metric([reason], s["dropped"].get(reason, 0))
        yield dropped
        yield from _offload_metrics(s)


def _offload_metrics(s: dict[str, Any]):
    """Sessions moved out of memory and back (offload.py); zeros without --swap-space/--session-dir."""
    for name, doc, key in (
        ("kvagent_sessions_swapped", "Idle sessions held in host memory (--swap-space).", "swapped"),
        ("kvagent_sessions_on_disk", "Sessions held in --session-dir.", "on_disk"),
        ("kvagent_swap_bytes", "Bytes of the sessions held in host memory.", "swap_bytes"),
        ("kvagent_swap_space_bytes", "--swap-space in bytes (0: none).", "swap_space"),
    ):
        yield GaugeMetricFamily(name, doc, value=s.get(key, 0))
    for name, doc, key, label, values in (
        ("kvagent_session_swap_outs", "Sessions moved out of memory, by where to.", "swap_outs", "where", PLACES),
        ("kvagent_session_swap_ins", "Sessions moved back into memory, by where from.", "swap_ins", "where", PLACES),
        ("kvagent_session_swap_moved_bytes", "Session state bytes moved, out or in.", "swap_moved_bytes",
         "direction", ("out", "in")),
        ("kvagent_session_swap_seconds", "Seconds spent moving sessions, out or in.", "swap_seconds",
         "direction", ("out", "in")),
    ):  # fmt: skip
        family = CounterMetricFamily(name, doc, labels=[label])
        for v in values:
            family.add_metric([v], s.get(key, {}).get(v, 0))
        yield family
