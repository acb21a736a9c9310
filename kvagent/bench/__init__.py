"""kvagent.bench: fidelity replay and speed benchmarks of eviction policies (`kvagent bench`).

episodes = load_episodes(["gen:seed=0,turns=24", "runs/x.traj.json"])
records = run_fidelity(engine, episodes, grid, out_dir="bench-out")
"""
