"""A request the server refuses: one line naming the field and the fix, sent as a 4xx JSON error."""

from __future__ import annotations

from kvagent.errors import KvagentError


class RequestError(KvagentError):
    """Bad input from a client: `status` is the HTTP status (400 unless said), `param` the field."""

    def __init__(self, message: str, status: int = 400, param: str | None = None, kind: str | None = None):
        super().__init__(" ".join(message.split()))  # one line, whatever the message was built from
        self.status = status
        self.param = param
        self.kind = kind or ("invalid_request_error" if status < 500 else "server_error")


class Busy(RequestError):
    """The bounded queue is full (429), or the server is draining for shutdown (503)."""
