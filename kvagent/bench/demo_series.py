"""What the demo's picture plots for each run, from its replay: the KV memory it held over the
episode's tokens and its fidelity turn by turn (`series`, stored in the run's record), and the
bound an evicting run's memory stays under (`memory_bound`)."""

from __future__ import annotations

from kvagent.bench.replay import ReplayResult
from kvagent.bench.stream import Stream


def series(stream: Stream, res: ReplayResult) -> dict:
    """Extra record fields: `memory` [[tokens fed, entries held]] after each segment, and per
    assistant turn its last token's position (`turn_end`), mean KL and top-1 agreement."""
    ends, kl, top1 = [], [], []
    pos = i = 0
    for seg in stream.segments:
        pos += len(seg.ids)
        if seg.kind != "step":
            continue
        n = len(seg.ids)
        ends.append(pos)
        kl.append(sum(res.kl[i : i + n]) / n)
        top1.append(sum(map(float, res.agree[i : i + n])) / n)
        i += n
    return {
        "memory": [list(p) for p in res.memory],
        "turn_end": ends,
        "turn_kl": kl,
        "turn_top1": top1,
        "fact_at": fact_position(stream),
    }


def fact_position(stream: Stream) -> int | None:
    """Where the planted fact's value first occurs in the stream (its tokens as the probe asks for
    them), or None."""
    if stream.probe is None:
        return None
    ids, value = stream.ids, list(stream.probe.value)
    n = len(value)
    return next((i for i in range(len(ids) - n + 1) if ids[i : i + n] == value), None)


def memory_bound(record: dict) -> int | None:
    """The most entries an evicting run's layer holds between forwards: a round runs when a layer
    reaches K + r (`Session._evict_due`), read off the run's own settings; None for `full`."""
    if record.get("policy") == "full" or not isinstance(record.get("budget"), int):
        return None
    return record["budget"] + record["buffer"]
