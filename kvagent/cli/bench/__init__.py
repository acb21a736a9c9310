"""`kvagent bench fidelity|study|speed|serve|episodes`: `commands.py` declares the group and its
options; the bodies: `run.py` (fidelity, speed, study), `segments.py` (study's segments claims),
`serve.py` (bench serve), `episodes.py` (episodes build|check)."""
