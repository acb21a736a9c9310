"""`kvagent serve`: load the engine, bind the address, run the OpenAI-compatible app on uvicorn
until Ctrl-C or SIGTERM (docs/serve.md). SIGTERM drains: uvicorn stops accepting, gives in-flight
requests --drain-timeout seconds, cancels the rest, and the command exits 0."""

from __future__ import annotations

import signal
import socket
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kvagent.cli.settings import CacheOptions, EngineOptions
from kvagent.errors import ConfigError, KvagentError

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


def _check(host: str, port: int, max_batch: int, kv_memory: float | None, max_queue: int, max_sessions: int,
           drain_timeout: float, log_level: str) -> None:  # fmt: skip
    if not 0 <= port <= 65535:
        raise ConfigError(f"port: {port} is not a TCP port; use 1-65535 (0: any free port)")
    if max_batch < 1:
        raise ConfigError(f"max_batch: must be >= 1 (1 = no batching), got {max_batch}")
    if kv_memory is not None and not kv_memory > 0:
        raise ConfigError(f"kv_memory: must be > 0 GiB, got {kv_memory}; leave it out for no limit")
    if max_queue < 0:
        raise ConfigError(f"max_queue: must be >= 0, got {max_queue}")
    if max_sessions < 1:
        raise ConfigError(f"max_sessions: must be >= 1, got {max_sessions}")
    if drain_timeout < 0:
        raise ConfigError(f"drain_timeout: must be >= 0 seconds, got {drain_timeout}")
    if log_level not in LOG_LEVELS:
        raise ConfigError(f"log_level: got {log_level!r}; choose one of {', '.join(LOG_LEVELS)}")
    if not host:
        raise ConfigError("host: empty; use 127.0.0.1 (this machine only) or 0.0.0.0 (every interface)")


def _bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before the model loads so a taken port fails at once."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise ConfigError(
            f"host: cannot resolve {host!r} ({e.strerror}); use an address such as 127.0.0.1"
        ) from None
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise ConfigError(
            f"port: cannot listen on {host}:{port} ({e.strerror}); pick another --port"
        ) from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def draining_server(config: Any, drain: Callable[[], None]) -> Any:
    """uvicorn's server, whose shutdown (it has stopped accepting by then) also starts the drain:
    open requests get --drain-timeout to finish, then end at their next token with finish_reason
    "abort" (streams still close with [DONE]), so uvicorn's wait for its connections ends cleanly."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        async def shutdown(self, sockets=None) -> None:
            threading.Thread(target=drain, name="kvagent-drain", daemon=True).start()
            await super().shutdown(sockets=sockets)

    return DrainingServer(config)


def run_serve(
    *, engine: EngineOptions, cache: CacheOptions | Mapping[str, Any], max_batch: int, kv_memory: float | None,
    host: str, port: int, max_queue: int, max_sessions: int, drain_timeout: float, served_model_name: str | None,
    log_level: str, swap_space: float | None = None, session_dir: str | None = None,
) -> None:  # fmt: skip
    _check(host, port, max_batch, kv_memory, max_queue, max_sessions, drain_timeout, log_level)
    if swap_space is not None and not swap_space > 0:
        raise ConfigError(f"swap_space: must be > 0 GiB, got {swap_space}; leave it out for none")
    if session_dir is not None and Path(session_dir).exists() and not Path(session_dir).is_dir():
        raise ConfigError(f"session_dir: {session_dir} is a file; pass a directory (made if missing)")
    try:
        import uvicorn

        from kvagent.serve import ServeConfig, create_app
    except ImportError as e:
        raise KvagentError(f"serve: {e.name} is not installed; run: pip install 'kvagent[serve]'") from None
    from kvagent.cli.common import load_engine
    from kvagent.cli.settings import cache_config_of

    defaults = cache_config_of(cache)
    sock = _bind(host, port)
    bound = sock.getsockname()[1]
    model = engine.model
    try:
        engine = load_engine(engine, max_batch=max_batch)
    except BaseException:
        sock.close()
        raise
    config = ServeConfig(
        model_name=served_model_name or model,
        defaults=defaults,
        kv_memory=int(kv_memory * 2**30) if kv_memory is not None else None,
        max_queue=max_queue,
        max_sessions=max_sessions,
        drain_timeout=drain_timeout,
        swap_space=int(swap_space * 2**30) if swap_space is not None else 0,
        session_dir=session_dir,
    )
    app = create_app(engine, config)
    # uvicorn's own grace period is a backstop only: the drain ends what runs cleanly before it
    uv = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=drain_timeout + 10, lifespan="on")
    server = draining_server(uv, drain=app.state.server.drain)
    budget = f" K={defaults.budget}" if defaults.budget is not None else ""
    print(
        f"kvagent serve: {config.model_name} at http://{host}:{bound}/v1 ({defaults.policy}{budget} "
        f"{defaults.mode}, max batch {max_batch}); Ctrl-C or SIGTERM stops it",
        flush=True,
    )
    offload = app.state.server.conversations.offload
    if session_dir is not None:
        print(f"kvagent serve: {len(offload.disk)} saved sessions found in {session_dir}", flush=True)
    # uvicorn takes SIGTERM for its graceful shutdown and raises it again once done; by then the
    # drain is over, so the second delivery must not turn into kvagent's usual interrupt (exit 130).
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        server.run(sockets=[sock])
    finally:
        signal.signal(signal.SIGTERM, previous)
        sock.close()
        engine.close()
    served = sum(
        s.value
        for m in app.state.server.metrics.requests.collect()
        for s in m.samples
        if s.name.endswith("_total")
    )
    print(f"kvagent serve: stopped after {int(served)} requests", flush=True)
    if session_dir is not None:
        print(f"kvagent serve: {len(offload.disk)} sessions saved in {session_dir}", flush=True)
