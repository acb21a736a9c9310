"""The demo wing of kvagent.bench (`kvagent demo` / `make demo`; its runs go through `fidelity/`): what the
picture plots for each run (`series`: KV memory over the episode, fidelity per turn, the K + r band)
and the picture itself (`plot`, one PNG)."""
