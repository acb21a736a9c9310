"""The fidelity wing of kvagent.bench (`kvagent bench fidelity`, and the runs under `bench study` and
`kvagent demo`): every episode replayed under every run spec and compared token by token with the
full cache (`run`), several processes on one out dir (`shared_results`), its table and plot (`tables`,
`plots`). What the commands and the study call is here."""

from kvagent.bench.fidelity.run import load_records, make_grid, pending_runs, run_fidelity

__all__ = ["load_records", "make_grid", "pending_runs", "run_fidelity"]
