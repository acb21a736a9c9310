"""`kvagent images base|build|check`: `commands.py` declares the group; the bodies: `build.py`
(base, build), `check.py`."""
