"""`kvagent bench study --claim segments` (or `segments-replication`): one of the third claim's
pre-registered designs (`kvagent.bench.study.segments.DESIGNS`), run or resumed, then its report
(study.md, study.json)."""

from __future__ import annotations

from kvagent.cli.common import check_out_dir, load_engine, resume_hint


def run_segments_bench(
    *, engine, episodes, out, quiet, report_only=False, claim="segments", estimate_only=False
) -> dict:
    """`estimate_only`: choose the episodes and say how many runs they take, then stop (nothing
    written, no run started)."""
    import json

    from kvagent.bench.fidelity import load_records
    from kvagent.bench.sources import load_episodes
    from kvagent.bench.stream import build_stream
    from kvagent.bench.study import segments as sg
    from kvagent.cli.environments import local_sandbox
    from kvagent.cli.ui import Bars, print_markdown
    from kvagent.errors import ConfigError
    from kvagent.fileio import atomic_write_json, atomic_write_text

    design = sg.DESIGNS[claim]
    outp = check_out_dir(out or f"study-{claim}")
    selection = outp / "design.json"
    if report_only:
        if not selection.exists():
            raise ConfigError(f"report-only: no {selection}; run the study first")
        data = json.loads(selection.read_text(encoding="utf-8"))
        if data.get("claim") != design.claim:
            raise ConfigError(f"out: {outp} holds the {data.get('claim')} study; pass another --out")
        chosen, rows = data["chosen"], data["rows"]
        records = [r for r in load_records(outp) if r.get("model") == engine.model]
    else:
        if (
            selection.exists()
            and json.loads(selection.read_text(encoding="utf-8")).get("claim") != design.claim
        ):
            raise ConfigError(f"out: {outp} holds another study; pass another --out for --claim {claim}")
        eps = [sg.prepare(design, e) for e in load_episodes(list(episodes), open_env=local_sandbox)]
        eng = load_engine(engine)
        try:
            streams = [build_stream(e, eng.tokenizer, max_tokens=design.max_tokens) for e in eps]
            picked, rows = sg.select(design, streams)
            if not picked:
                raise ConfigError(f"episodes: none of the {len(rows)} is eligible for the {claim} design")
            chosen = [s.name for s in picked]
            print(f"study {claim}: {len(chosen)} episodes ({', '.join(chosen)}), "
                  f"{len(sg.specs_for(design, picked[0]))} runs each", flush=True)  # fmt: skip
            if estimate_only:  # its CPU estimate per episode is the design's (docs/study.md)
                print(f"--estimate-only: no run started; {outp} untouched", flush=True)
                return {"claim": claim, "chosen": chosen}
            outp.mkdir(parents=True, exist_ok=True)
            atomic_write_json(selection, {"claim": design.claim, "chosen": chosen, "rows": rows})
            with resume_hint(outp), Bars(enabled=not quiet) as bars:
                records = sg.run_segments(eng, picked, design, outp, engine.model, progress=bars)
        finally:
            eng.close()
    result = sg.analyse(records, design, chosen)
    atomic_write_json(outp / "study.json", result)
    text = sg.report_markdown(result, design, rows)
    atomic_write_text(outp / "study.md", text)
    print_markdown(text)
    return result
