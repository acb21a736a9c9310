"""Sandbox errors: one line naming the problem and the fix."""

from kvagent.errors import KvagentError


class SandboxError(KvagentError):
    """A sandbox could not be created or used (bad repo path, image, Docker state)."""


class DockerUnavailableError(SandboxError):
    """The Docker daemon cannot be reached."""
