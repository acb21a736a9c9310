"""`kvagent inspect`: `commands.py` declares it; `run.py` shows episodes in the terminal, `page.py`
writes the static page (--html), `view.py` is the episode as both show it."""
