"""The protocol pyramid_reference.py and pyramid_mass.py share (issue #32): SmolLM2 float32, the
first episodes with at least context + forced tokens, the first `--context` compressed once, the
next `--forced` teacher forced; window 64, kernel 5."""

from __future__ import annotations

import argparse

from kvagent.bench.episodes import Episode
from kvagent.bench.sources import load_episodes
from kvagent.bench.stream import build_stream
from kvagent.cli.settings import add_arguments
from kvagent.errors import KvagentError
from kvagent.options import split_list


def add_protocol_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", required=True)
    ap.add_argument(
        "--episodes",
        default="bundled:plant=0",
        help="an episode spec; default: the study's bundled file (`kvagent bench episodes build`)",
    )
    ap.add_argument("--n", type=int, default=3, help="episodes (the first long enough)")
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--forced", type=int, default=256)
    add_arguments(ap, one=["window"], window=64)
    ap.add_argument("--kernel", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")


def read_episodes(args) -> list[Episode]:
    """The episodes `--episodes` names, read before any model loads: a bad spec, or the bundled file
    not built yet, is one line (naming `kvagent bench episodes build`)."""
    try:
        return load_episodes([args.episodes])
    except KvagentError as e:
        raise SystemExit(str(e)) from None


def protocol_episodes(loaded: list[Episode], args, tokenizer) -> list[dict]:
    """The first `args.n` of `loaded` long enough, each {"name", "ids"} cut to context + forced."""
    need = args.context + args.forced
    episodes = []
    for e in loaded:
        ids = build_stream(e, tokenizer).ids
        if len(ids) >= need:
            episodes.append({"name": e.name, "ids": ids[:need]})
        if len(episodes) == args.n:
            break
    return episodes


def positive_floats(text: str, option: str) -> list[float]:
    """`--beta 20,5` -> [20.0, 5.0], or one line naming the bad value and exit 2."""
    try:
        values = [float(x) for x in split_list(text, option)]
    except ValueError:
        values = []
    if not values or any(v <= 0 for v in values):
        raise SystemExit(
            f"{option}: expected positive numbers separated by commas (e.g. 20,5,2), got {text!r}"
        )
    return values
