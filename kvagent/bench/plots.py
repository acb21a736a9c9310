"""A matplotlib figure written as a PNG, atomically: the one saver every wing's plots use (fidelity,
speed, the study, the demo)."""

from __future__ import annotations

import io
from pathlib import Path

from kvagent.fileio import atomic_write_bytes


def _save(fig, path: Path) -> Path:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return atomic_write_bytes(path, buf.getvalue())
