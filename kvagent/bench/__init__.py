"""kvagent.bench: benchmarks of eviction policies (`kvagent bench`). Each wing with more than one module
has its sub-package: fidelity replay (`fidelity/`), the study (`study/`) and serve load (`serve_load/`);
the speed benchmark (`speed.py`), the demo's picture and what the wings share stay here.

episodes = load_episodes(["gen:seed=0,turns=24", "runs/x.traj.json"], open_env=local_sandbox)  # sources.py
streams = [build_stream(e, engine.tokenizer) for e in episodes]                               # stream.py
records = run_fidelity(engine, streams, make_grid(...), "bench-out", "smollm2")               # fidelity/
"""
