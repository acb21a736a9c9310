"""The speed wing of kvagent.bench (`kvagent bench speed`; `benchmarks/runtime_speed.py` and
`benchmarks/policy_overhead.py` time decode through it): decode latency, round cost, KV memory and
persistent vs reprefill episode cost, measured in one run (`run`), and their tables and plot (`report`)."""
