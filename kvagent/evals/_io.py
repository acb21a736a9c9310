"""Evals' file helpers are the package-wide atomic writers."""

from kvagent.fileio import atomic_write_bytes, atomic_write_json, atomic_write_text

__all__ = ["atomic_write_bytes", "atomic_write_json", "atomic_write_text"]
