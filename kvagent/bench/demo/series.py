"""What the demo's picture plots for each run, from its replay: the KV memory it held over the
episode's tokens and its fidelity turn by turn (`series`, stored in the run's record), and the
band an evicting run's memory stays in (`memory_band`), read off the run's own capacity."""

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
        "capacity": res.capacity,
    }


def fact_position(stream: Stream) -> int | None:
    """Where the planted fact's value first occurs in the stream (its tokens as the probe asks for
    them), or None."""
    if stream.probe is None:
        return None
    ids, value = stream.ids, list(stream.probe.value)
    n = len(value)
    return next((i for i in range(len(ids) - n + 1) if ids[i : i + n] == value), None)


def memory_band(record: dict) -> tuple[int, int] | None:
    """(low, high): the entries an evicting run's fullest layer holds between forwards once full. High
    is the run's own capacity as the runtime sized it for its settings (`capacity`: K + r, or its
    framework's peak); a round makes r entries' room, so low is r under it. None for `full` and for
    records without a capacity (written before the field, or a budget that is not fixed)."""
    cap = record.get("capacity")
    if record.get("policy") == "full" or not isinstance(cap, int):
        return None
    return cap - record["buffer"], cap


def memory_bound(record: dict) -> int | None:
    """The most entries an evicting run's layer holds between forwards; None for `full`."""
    band = memory_band(record)
    return None if band is None else band[1]
