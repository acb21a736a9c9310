"""The FastAPI app: OpenAI's chat completions and completions (streamed over SSE or not), models,
health and Prometheus metrics, over one engine whose conversations each keep one live session.

Every refusal is a JSON error `{"error": {"message": ONE LINE, "type", "param", "code"}}` with a
4xx status: bad JSON, a bad field, an unknown model, a prompt past the context, a cache setting
the runtime refuses (400); an unknown path (404) or method (405); a full queue (429); shutting
down (503). A 500 means a bug in the server, and says so in one line too."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from kvagent.errors import KvagentError
from kvagent.runtime import CacheConfig, Sampling
from kvagent.runtime.generation import Stopping
from kvagent.serve import protocol, render
from kvagent.serve.conversations import Conversations
from kvagent.serve.errors import Busy, RequestError
from kvagent.serve.history import mask_messages
from kvagent.serve.kvconfig import request_config, request_spelling
from kvagent.serve.metrics import Metrics
from kvagent.serve.offload import Offload
from kvagent.serve.responses import Chunks, chat_body, completion_body, new_id
from kvagent.serve.runner import Job, ReplySpec, Runner


@dataclass
class ServeConfig:
    model_name: str  # what /v1/models lists and requests must name
    defaults: CacheConfig = field(default_factory=CacheConfig)  # the server's cache flags
    kv_memory: int | None = None  # bytes of KV that idle sessions may hold together
    max_queue: int = 64  # requests admitted beyond those running
    max_sessions: int = 1024
    drain_timeout: float = 30.0  # seconds in-flight requests get at shutdown (Server.drain)
    swap_space: int = 0  # bytes of host memory idle sessions move to under pressure (offload.py)
    session_dir: str | None = None  # where they go next, and where a stopping server saves them all


def error_response(e: Exception) -> JSONResponse:
    if isinstance(e, RequestError):
        status, kind, param, message = e.status, e.kind, e.param, str(e)
    elif isinstance(e, KvagentError):  # the runtime's refusals (ConfigError) are the request's fault
        status, kind, param, message = 400, "invalid_request_error", None, request_spelling(str(e))
    else:
        first = (str(e).strip().splitlines() or [""])[0][:300]
        status, kind, param = 500, "server_error", None
        message = (
            f"internal error ({type(e).__name__}: {first}); this is a bug in kvagent serve, please report it"
        )
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    headers = {"Retry-After": "1"} if status in (429, 503) else None
    return JSONResponse(body, status_code=status, headers=headers)


class Server:
    """What the routes share: the engine, its conversations, the runner and the metrics."""

    def __init__(self, engine: Any, config: ServeConfig) -> None:
        self.engine = engine
        self.config = config
        offload = None
        if config.swap_space or config.session_dir is not None:
            offload = Offload(engine, config.swap_space, config.session_dir)
        self.conversations = Conversations(engine, config.kv_memory, config.max_sessions, offload)
        self.runner = Runner(engine, self.conversations, config.max_queue)
        self.metrics = Metrics(self.state)
        self.created = int(time.time())

    def drain(self) -> None:
        """Stop admitting; in-flight requests get the drain timeout, then end at their next token."""
        self.runner.drain(self.config.drain_timeout)

    def state(self) -> dict[str, Any]:
        sched = self.engine.batcher
        return {
            **self.conversations.snapshot(),
            **self.runner.state(),
            "kv_memory": self.config.kv_memory,
            "max_batch": self.engine.max_batch,
            "batch_forwards": sched.forwards if sched is not None else 0,
            "batch_rows": sched.rows if sched is not None else 0,
            "static_steps": self.engine.step_runner.steps,
            "eager_forwards": dict(self.engine.step_runner.eager),
            "started": dict(self.conversations.started),
            "dropped": dict(self.conversations.dropped),
        }

    # ----------------------------------------------------------------- a generation request
    async def generate(self, request: Request, endpoint: str) -> Response:
        raw = await request.body()
        req = protocol.parse_chat(raw) if endpoint == "chat" else protocol.parse_completion(raw)
        if req.model != self.config.model_name:
            raise RequestError(
                f"model: {req.model!r} is not served here; use {self.config.model_name!r} (GET /v1/models)",
                param="model",
            )
        config = request_config(self.config.defaults, req.kv)
        # kv_history: reprefill re-renders the older observations as the paper's placeholder line;
        # a persistent session keeps the text and forgets their tokens (runner.py), since no
        # placeholder can enter the middle of a live cache.
        forget = req.mask_keep is not None and config.mode == "persistent"
        if req.mask_keep is not None and not forget:
            req.messages = mask_messages(req.messages, req.mask_keep)
        # The segments policy groups by messages: their starts are its marks, as the agent loop's.
        mark = config.policy == "segments" and endpoint == "chat"
        need = "kv_history" if forget else "kv_policy" if mark else None
        prompt = await run_in_threadpool(render.prompt_ids, self.engine.tokenizer, req, need)
        spec = self._spec(req, len(prompt.ids))
        job = Job(prompt.ids, prompt.first, config, spec, req.stream, asyncio.get_running_loop())
        job.mask = (req.mask_keep, prompt.observations) if forget else None
        job.marks = prompt.segments if mark else []
        job.require_session = req.require_session
        job.continues = any(m["role"] == "assistant" for m in req.messages or [])
        try:
            self.runner.submit(job)
        except Busy as e:
            self.metrics.rejected.labels("draining" if e.status == 503 else "queue_full").inc()
            raise
        tools_on = bool(req.tools) and req.tool_choice != "none"
        try:
            first = await self._next(job, request)
        except BaseException:
            job.cancel.set()
            raise
        if first is None:
            return Response(status_code=499)  # the client is gone; nobody reads this
        if first.kind == "error":
            raise first.value
        if req.stream:
            chunks = Chunks(endpoint, self.config.model_name, tools_on, req.include_usage)
            return StreamingResponse(self._stream(job, chunks), media_type="text/event-stream")
        while (event := await self._next(job, request)) is not None and event.kind == "text":
            pass
        if event is None:
            return Response(status_code=499)
        if event.kind == "error":
            raise event.value
        self._count(job, event.value)
        rid = new_id("chatcmpl" if endpoint == "chat" else "cmpl")
        if endpoint == "chat":
            return JSONResponse(chat_body(rid, self.config.model_name, event.value, tools_on))
        return JSONResponse(completion_body(rid, self.config.model_name, event.value))

    def _spec(self, req: protocol.GenRequest, n_prompt: int) -> ReplySpec:
        ctx = self.engine.max_context
        if ctx and n_prompt >= ctx:
            raise RequestError(
                f"messages: the prompt is {n_prompt} tokens, the model's context {ctx}; shorten it",
                param="messages",
            )
        left = (ctx - n_prompt) if ctx else None
        max_tokens = req.max_tokens if req.max_tokens is not None else (left or 4096)
        if left is not None and max_tokens > left:
            raise RequestError(
                f"max_tokens: {max_tokens} plus the prompt's {n_prompt} tokens exceeds the model's context "
                f"({ctx}); ask for at most {left}",
                param="max_tokens",
            )
        if req.min_tokens > max_tokens:
            raise RequestError(
                f"min_tokens: {req.min_tokens} exceeds max_tokens {max_tokens}", param="min_tokens"
            )
        sampling = Sampling(temperature=req.temperature, top_p=req.top_p, top_k=req.top_k)
        seed = req.seed if req.seed is not None else secrets.randbits(63)
        stopping = Stopping(
            stop=req.stop, stop_token_ids=req.stop_token_ids, min_tokens=req.min_tokens, ignore_eos=req.ignore_eos,
            include_stop_str=req.include_stop_str_in_output, skip_special_tokens=req.skip_special_tokens,
        )  # fmt: skip
        return ReplySpec(max_tokens=max_tokens, sampling=sampling, seed=seed, stopping=stopping)

    async def _next(self, job: Job, request: Request):
        """The job's next event, or None if the client disconnected first (the job is cancelled)."""
        getter = asyncio.ensure_future(job.events.get())
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            done, _ = await asyncio.wait({getter, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not getter.done():
                getter.cancel()
        if getter in done:
            return getter.result()
        job.cancel.set()
        self.metrics.disconnects.inc()
        return None

    async def _stream(self, job: Job, chunks: Chunks):
        finished = False
        try:
            if (head := chunks.first()) is not None:
                yield head
            while True:
                batch = [await job.events.get()]
                while not job.events.empty():
                    batch.append(job.events.get_nowait())
                texts = [e for e in batch if e.kind == "text"]
                if texts and (piece := chunks.grow(texts[-1].value)) is not None:
                    yield piece  # only the newest text matters: it holds the older
                end = next((e for e in batch if e.kind != "text"), None)
                if end is None:
                    continue
                finished = True
                if end.kind == "done":
                    self._count(job, end.value)
                    for piece in chunks.end(end.value):
                        yield piece
                else:
                    yield f"data: {error_response(end.value).body.decode()}\n\n"
                yield "data: [DONE]\n\n"
                return
        finally:
            if not finished:  # the client left (or the server is stopping): stop sampling
                job.cancel.set()
                self.metrics.disconnects.inc()

    def _count(self, job: Job, outcome) -> None:
        m = self.metrics
        m.count(
            outcome.usage, outcome.delta, outcome.plan.depth if outcome.plan.status == "continued" else None
        )
        end = time.perf_counter()
        if outcome.decoded.first_token_at is not None:
            m.ttft.observe(outcome.decoded.first_token_at - job.submitted)
        m.duration.observe(end - job.submitted)


async def _disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def create_app(engine: Any, config: ServeConfig) -> FastAPI:
    server = Server(engine, config)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        # uvicorn has stopped accepting and waited for open requests (--drain-timeout); what is
        # still running is cancelled here and the workers are joined before the process exits.
        await run_in_threadpool(server.runner.drain, 0.0)
        server.conversations.close()

    app = FastAPI(title="kvagent serve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = server

    app.add_middleware(CountRequests, metrics=server.metrics)

    @app.exception_handler(KvagentError)
    async def _kvagent_error(request: Request, e: KvagentError):
        return error_response(e)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, e: HTTPException):
        what = "no such endpoint" if e.status_code == 404 else str(e.detail)
        fix = "see GET /v1/models, POST /v1/chat/completions, POST /v1/completions, GET /health, GET /metrics"
        return error_response(
            RequestError(f"{request.method} {request.url.path}: {what}; {fix}", status=e.status_code)
        )

    @app.exception_handler(Exception)
    async def _bug(request: Request, e: Exception):
        return error_response(e)

    @app.get("/health")
    async def health():
        if not server.runner.accepting:
            return error_response(Busy("server: shutting down", status=503))
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        card = {"id": config.model_name, "object": "model", "created": server.created, "owned_by": "kvagent",
                "max_model_len": engine.max_context}  # fmt: skip
        return {"object": "list", "data": [card]}

    @app.get("/metrics")
    async def metrics():
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(generate_latest(server.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await server.generate(request, "chat")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await server.generate(request, "completions")

    return app


class CountRequests:
    """ASGI middleware: every answered request counted by endpoint and status (a plain ASGI wrapper,
    not BaseHTTPMiddleware, so streaming and disconnects pass through untouched)."""

    def __init__(self, app, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = {"code": 499}  # no response started: the client left first

        async def send_counted(message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_counted)
        finally:
            self.metrics.requests.labels(_endpoint(scope["path"]), str(status["code"])).inc()


def _endpoint(path: str) -> str:
    known = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics")
    return path if path in known else "other"
