"""kvagent.bench: benchmarks of eviction policies (`kvagent bench`). Each wing has its sub-package:
fidelity replay (`fidelity/`), the study (`study/`), serve load (`serve_load/`), the speed benchmark
(`speed/`) and the demo's picture (`demo/`); what several wings share stays here.

episodes = load_episodes(["gen:seed=0,turns=24", "runs/x.traj.json"], open_env=local_sandbox)  # sources.py
streams = [build_stream(e, engine.tokenizer) for e in episodes]                               # stream.py
records = run_fidelity(engine, streams, make_grid(...), "bench-out", "smollm2")               # fidelity/
"""
