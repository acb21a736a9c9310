"""The study wing of kvagent.bench (`kvagent bench study`, docs/study.md): a seed paper's claim under a design
fixed in advance, run as fidelity replays (`run`), then tested (`stats`, `analysis`, `verdicts`) and reported."""
