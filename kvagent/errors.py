"""User-facing errors: one line that names the problem and the fix."""


class KvagentError(Exception):
    """An error caused by user input or environment; the CLI prints it as one line and exits 2."""


class ConfigError(KvagentError, ValueError):
    """A bad configuration value (names the field and the fix)."""


class Terminated(KeyboardInterrupt):
    """A stop signal (SIGTERM, SIGHUP) raised as KeyboardInterrupt, so every `with` closes its
    sandbox; unlike Ctrl-C, which the chat takes as "stop this reply", it always ends the run."""
