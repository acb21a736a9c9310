"""kvagent.bench: fidelity replay and speed benchmarks of eviction policies (`kvagent bench`); the
study (`study/`) and serve load (`serve_load/`) wings in their sub-packages.

episodes = load_episodes(["gen:seed=0,turns=24", "runs/x.traj.json"], open_env=local_sandbox)  # sources.py
streams = [build_stream(e, engine.tokenizer) for e in episodes]                               # stream.py
records = run_fidelity(engine, streams, make_grid(...), "bench-out", "smollm2")               # fidelity.py
"""
