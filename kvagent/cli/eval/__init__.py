"""The SWE-bench commands, `kvagent eval|grade|report`: `commands.py` declares them; the bodies:
`run.py` (eval: plan, run with a live table, report), `ray.py` (eval --ray), `grade.py`, `report.py`."""
