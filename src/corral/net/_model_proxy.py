"""The host model proxy: the only place a model API key lives.

The agent CLI in the sandbox talks plain HTTP to ``127.0.0.1:<port>`` inside the sandbox;
the in-sandbox forwarder (:mod:`corral._insandbox.entry`) pipes that to a unix socket
bound in from the host, where a :class:`ModelProxy` serves. The CLI's API key is the
run's token (a per-run secret only its sandbox holds): the proxy checks it first (in
constant time, whichever way the CLI sends its key: ``x-api-key``, ``Authorization:
Bearer``, ``x-goog-api-key``, ``api-key`` or Gemini's ``?key=``) and answers a request
without it with a 401, forwarding and counting nothing. It then drops every credential the
CLI sent, adds the real one, forwards to the upstream and streams the answer back chunk by
chunk (SSE passes through unbuffered).

It also meters tokens per run (from the streamed ``usage`` of Anthropic Messages and
OpenAI Responses events, Gemini's ``usageMetadata``, or a JSON body's ``usage``) and can enforce a budget: once a
run's total reaches ``budget`` tokens, further requests are refused with a 403 whose
message says so (the request that crosses the budget completes). An upstream that does
not answer within ``idle_timeout`` seconds (before the headers, or between two chunks)
gets the CLI a clear error instead of a hang: a 504 before the headers, an error event
mid-stream.
"""

from __future__ import annotations

import contextlib
import functools
import hmac
import json
import os
import re
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qsl, urlencode, urlsplit

import anyio
import anyio.abc
import certifi
import httpx

from corral._errors import ConfigError, ModelKeyMissing
from corral._telemetry import span_at
from corral.net._http11 import Request, Response, serve_unix

__all__ = [
    "PLACEHOLDER_KEY",
    "DEFAULT_PATHS",
    "ModelApi",
    "ModelProxy",
    "Upstream",
    "Usage",
    "UsageMeter",
    "shared_ssl_context",
]

ModelApi = Literal["anthropic", "openai", "gemini"]
PLACEHOLDER_KEY = "corral-placeholder-no-real-key-in-sandbox"
"""The credential agent CLIs get inside the sandbox (the proxy replaces it)."""

HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "transfer-encoding", "upgrade", "host", "content-length", "proxy-connection",
})  # fmt: skip
CREDENTIAL_HEADERS = frozenset({"x-api-key", "authorization", "api-key", "x-goog-api-key",
                                "cookie"})
DEFAULT_PATHS: dict[str, tuple[str, ...]] = {
    # What the CLIs call; anything else (files, batches, admin, fine-tuning) is refused so
    # that an agent cannot spend or read through the key beyond model calls.
    "anthropic": ("/v1/messages", "/v1/models"),
    "openai": ("/v1/responses", "/v1/chat/completions", "/v1/models"),
    # Gemini: only the three model-call methods (see GEMINI_METHODS), never a listing.
    "gemini": ("/v1beta/models", "/v1/models"),
}
GEMINI_METHODS = (":generateContent", ":streamGenerateContent", ":countTokens")
"""The Gemini API methods the proxy forwards (``/v1beta/models/<model>:<method>``)."""
_GEMINI_CALL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}("
                          + "|".join(map(re.escape, GEMINI_METHODS)) + ")")
_DEFAULTS: dict[str, tuple[str, str, str]] = {
    # api: (base URL variable, default base URL, key variable)
    "anthropic": ("ANTHROPIC_BASE_URL", "https://api.anthropic.com", "ANTHROPIC_API_KEY"),
    "openai": ("OPENAI_BASE_URL", "https://api.openai.com/v1", "OPENAI_API_KEY"),
    "gemini": ("GOOGLE_GEMINI_BASE_URL", "https://generativelanguage.googleapis.com",
               "GEMINI_API_KEY"),
}


@dataclass(frozen=True)
class Upstream:
    """Where model requests go, and the credential the proxy adds.

    ``base_url`` is the API's base as its SDKs take it: ``https://api.anthropic.com`` for
    Anthropic (requests keep their ``/v1/...`` path), ``https://api.openai.com/v1`` for
    OpenAI (a request for ``/v1/responses`` goes to ``<base_url>/responses``).
    """

    api: ModelApi
    base_url: str
    api_key: str = field(repr=False)
    allowed_paths: tuple[str, ...] | None = None
    """Request path prefixes the proxy forwards (``None``: :data:`DEFAULT_PATHS` of the
    API). A prefix matches the path itself and anything below it (``/v1/messages`` allows
    ``/v1/messages/count_tokens``)."""

    def __post_init__(self) -> None:
        if self.api not in _DEFAULTS:
            raise ConfigError(f"unknown model API {self.api!r}: use 'anthropic', 'openai' or "
                              "'gemini'")
        parts = urlsplit(self.base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(
                f"model upstream base URL {self.base_url!r} must be an http(s) URL"
            )
        if not self.api_key or any(c in self.api_key for c in "\r\n\0"):
            raise ConfigError(f"the {self.api} API key is empty or contains control characters")

    @classmethod
    def from_env(cls, api: ModelApi, env: Mapping[str, str] | None = None) -> Upstream:
        """From the host's standard variables (``ANTHROPIC_BASE_URL``/``ANTHROPIC_API_KEY``,
        ``OPENAI_BASE_URL``/``OPENAI_API_KEY``, ``GOOGLE_GEMINI_BASE_URL``/``GEMINI_API_KEY``)."""
        if api not in _DEFAULTS:
            raise ConfigError(f"unknown model API {api!r}: use 'anthropic', 'openai' or "
                              "'gemini'")
        env = os.environ if env is None else env
        url_var, default_url, key_var = _DEFAULTS[api]
        key = env.get(key_var, "")
        if not key:
            raise ModelKeyMissing(
                f"{key_var} is not set on the host: the model proxy needs it to call the "
                f"{api} API (the key stays on the host; the sandbox never sees it)"
            )
        return cls(api, env.get(url_var) or default_url, key)

    def allows(self, target: str) -> bool:
        """Whether a request target's path is one the proxy forwards."""
        path = target.split("?", 1)[0]
        if "/../" in path + "/" or "/./" in path + "/" or "//" in path:
            return False
        prefixes = self.allowed_paths if self.allowed_paths is not None else DEFAULT_PATHS[
            self.api]
        if self.api == "gemini" and self.allowed_paths is None:
            # <prefix>/<model>:<method>: one plain model name, one model-call method
            return any(path.startswith(p + "/") and _GEMINI_CALL.fullmatch(path[len(p) + 1:])
                       is not None for p in prefixes)
        return any(path == p or path.startswith(p.rstrip("/") + "/") for p in prefixes)

    def url_for(self, target: str) -> str:
        """The upstream URL for a request target (``/v1/messages?beta=true``)."""
        if not target.startswith("/"):
            raise ConfigError(f"the model proxy only accepts origin-form targets, got {target!r}")
        base = self.base_url.rstrip("/")
        path, sep, query = target.partition("?")
        if sep and any(k == "key" for k, _v in parse_qsl(query, keep_blank_values=True)):
            # Gemini's key parameter carries the sandbox's token: never sent upstream (the
            # real key goes in a header)
            kept = [(k, v) for k, v in parse_qsl(query, keep_blank_values=True) if k != "key"]
            target = path + (f"?{urlencode(kept)}" if kept else "")
        if self.api == "openai" and base.endswith("/v1") and (
            target == "/v1" or target.startswith(("/v1/", "/v1?"))
        ):
            target = target[3:] or "/"
        return base + target

    def auth_headers(self) -> list[tuple[str, str]]:
        if self.api == "anthropic":
            return [("x-api-key", self.api_key)]
        if self.api == "gemini":
            return [("x-goog-api-key", self.api_key)]
        return [("authorization", f"Bearer {self.api_key}")]


@dataclass
class Usage:
    """Tokens one run used, as reported by the upstream."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    requests: int = 0
    refused: int = 0
    models: dict[str, dict[str, int]] = field(default_factory=dict)
    """Tokens (the four kinds above) and answered ``requests`` per model, as the upstream
    named the model in its response."""

    @property
    def total(self) -> int:
        return (self.input_tokens + self.output_tokens + self.cache_read_tokens
                + self.cache_write_tokens)

    def add(self, other: Usage, *, model: str | None = None) -> None:
        """Add one response's tokens (``other``), counted under ``model`` too."""
        for kind in TOKEN_KINDS:
            setattr(self, kind, getattr(self, kind) + getattr(other, kind))
        name = _model_name(model)
        if name is None or (name not in self.models and len(self.models) >= MAX_MODELS):
            return
        per = self.models.setdefault(name, dict.fromkeys((*TOKEN_KINDS, "requests"), 0))
        for kind in TOKEN_KINDS:
            per[kind] += getattr(other, kind)
        per["requests"] += 1

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["total"] = self.total
        return out

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Usage | None:
        """The usage a proxy wrote to ``path`` (``usage_path``); ``None`` if there is none."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            return None
        return cls.from_dict(data) if isinstance(data, dict) else None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Usage:
        """The inverse of :meth:`to_dict` (unknown keys and bad values ignored)."""
        usage = cls()
        for kind in (*TOKEN_KINDS, "requests", "refused"):
            setattr(usage, kind, _int(data.get(kind)))
        models = data.get("models")
        if isinstance(models, dict):
            for name, per in list(models.items())[:MAX_MODELS]:
                if _model_name(name) == name and isinstance(per, dict):
                    usage.models[name] = {k: _int(per.get(k))
                                          for k in (*TOKEN_KINDS, "requests")}
        return usage


TOKEN_KINDS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
MAX_MODELS = 32
"""Models one run's usage names at most (a run that asks for more is still metered in the
totals)."""


def _model_name(model: object) -> str | None:
    """``model`` if it is a plausible model name (printable, at most 200 characters)."""
    if isinstance(model, str) and 0 < len(model) <= 200 and model.isprintable():
        return model
    return None


@functools.cache
def shared_ssl_context() -> ssl.SSLContext:
    """One verifying TLS context per process (building one costs tens of milliseconds)."""
    return ssl.create_default_context(cafile=certifi.where())


def _int(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else 0


class UsageMeter:
    """Reads ``usage`` out of one response's bytes as they stream by (never raises)."""

    def __init__(self, api: ModelApi, *, sse: bool) -> None:
        self.api = api
        self.sse = sse
        self.usage = Usage()
        self.model: str | None = None
        """The model the response says served it (``None`` until one is seen)."""
        self._buf = b""
        self._json = bytearray()

    def feed(self, chunk: bytes) -> None:
        if not self.sse:
            if len(self._json) < (8 << 20):
                self._json += chunk
            return
        self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        if len(self._buf) > (8 << 20):
            self._buf = b""  # a runaway line: give up on it rather than grow
        for line in lines:
            if line.startswith(b"data:"):
                self._event(line[5:].strip())

    def finish(self) -> Usage:
        if not self.sse and self._json:
            with contextlib.suppress(ValueError):
                data = json.loads(bytes(self._json))
                if isinstance(data, dict) and self.api == "gemini":
                    self._gemini(data)
                elif isinstance(data, dict):
                    self._usage(data.get("usage"), replace_output=True)
                    self._model(data.get("model"))
        elif self._buf.startswith(b"data:"):
            self._event(self._buf[5:].strip())
        self._buf = b""
        return self.usage

    def _event(self, raw: bytes) -> None:
        try:
            data = json.loads(raw)
        except ValueError:
            return
        if not isinstance(data, dict):
            return
        if self.api == "gemini":
            self._gemini(data)
            return
        kind = data.get("type")
        if kind == "message_start":  # anthropic
            message = data.get("message")
            if isinstance(message, dict):
                self._usage(message.get("usage"), replace_output=True)
                self._model(message.get("model"))
        elif kind == "message_delta":
            self._usage(data.get("usage"), replace_output=True, only_output=True)
        elif kind in ("response.completed", "response.incomplete", "response.failed"):
            response = data.get("response")
            if isinstance(response, dict):
                self._usage(response.get("usage"), replace_output=True)
                self._model(response.get("model"))

    def _gemini(self, data: dict[str, Any]) -> None:
        """A GenerateContentResponse (one SSE frame or a whole body): ``usageMetadata`` is
        cumulative, so the latest one wins."""
        self._model(data.get("modelVersion"))
        meta = data.get("usageMetadata")
        if not isinstance(meta, dict):
            return
        u = self.usage
        cached = _int(meta.get("cachedContentTokenCount"))
        u.input_tokens = max(_int(meta.get("promptTokenCount")) - cached, 0)
        u.cache_read_tokens = cached
        u.output_tokens = _int(meta.get("candidatesTokenCount")) + _int(
            meta.get("thoughtsTokenCount"))

    def _model(self, model: object) -> None:
        if self.model is None:
            self.model = _model_name(model)

    def _usage(self, usage: Any, *, replace_output: bool, only_output: bool = False) -> None:
        if not isinstance(usage, dict):
            return
        u = self.usage
        if "output_tokens" in usage:
            u.output_tokens = _int(usage.get("output_tokens"))  # cumulative in both APIs
        if only_output:
            return
        if self.api == "anthropic":
            u.input_tokens = _int(usage.get("input_tokens"))
            u.cache_read_tokens = _int(usage.get("cache_read_input_tokens"))
            u.cache_write_tokens = _int(usage.get("cache_creation_input_tokens"))
        else:
            details = usage.get("input_tokens_details")
            cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else 0
            u.input_tokens = max(_int(usage.get("input_tokens")) - cached, 0)
            u.cache_read_tokens = cached


_GEMINI_STATUS = {"permission_error": (403, "PERMISSION_DENIED"),
                  "invalid_request_error": (400, "INVALID_ARGUMENT"),
                  "authentication_error": (401, "UNAUTHENTICATED")}
"""An error kind → Gemini's ``code`` and ``status`` (anything else: 503 ``UNAVAILABLE``)."""


def _error_body(api: ModelApi, kind: str, message: str) -> bytes:
    if api == "gemini":
        code, status = _GEMINI_STATUS.get(kind, (503, "UNAVAILABLE"))
        body: dict[str, Any] = {"error": {"code": code, "message": message, "status": status}}
    elif api == "anthropic":
        body = {"type": "error", "error": {"type": kind, "message": message}}
    else:
        body = {"error": {"message": message, "type": kind, "code": kind, "param": None}}
    return json.dumps(body).encode()


def _error(api: ModelApi, status: int, kind: str, message: str) -> Response:
    data = _error_body(api, kind, message)
    return Response(status, [("content-type", "application/json"),
                             ("content-length", str(len(data)))], data)


def _stream_error_frame(api: ModelApi, message: str) -> bytes:
    if api == "gemini":
        return b"data: " + _error_body(api, "api_error", message) + b"\r\n\r\n"
    if api == "anthropic":
        data = {"type": "error", "error": {"type": "api_error", "message": message}}
        return b"event: error\ndata: " + json.dumps(data).encode() + b"\n\n"
    failed = {"type": "response.failed", "response": {
        "id": "resp_corral_proxy", "object": "response", "status": "failed",
        "error": {"code": "server_error", "message": message}, "output": []}}
    return b"event: response.failed\ndata: " + json.dumps(failed).encode() + b"\n\n"


class ModelProxy:
    """Forwards a sandbox's model requests to ``upstream`` with the real credential.

    ``budget``: total tokens (input + output + cache) the run may use; ``None`` = no limit.
    ``usage_path``: a JSON file rewritten (atomically) after every request with the usage
    so far, for other processes to read. ``max_failures``: after that many requests in a
    row that failed (upstream unreachable or timed out, or a 5xx), further requests get a
    403 naming the last failure (for CLIs that retry a dead endpoint forever); a request
    that succeeds resets the count. ``None``: no limit. ``token``: the run's token, the API
    key its sandbox's CLI sends (at least 16 characters); a request without it gets a 401
    and is neither forwarded nor counted. ``None``: every client that can connect to the
    socket is served (for sockets no one else can reach).
    """

    def __init__(
        self,
        upstream: Upstream,
        *,
        budget: int | None = None,
        idle_timeout: float = 300.0,
        connect_timeout: float = 10.0,
        usage_path: str | os.PathLike[str] | None = None,
        max_failures: int | None = None,
        token: str | None = None,
    ) -> None:
        if token is not None and (len(token) < 16 or not token.isascii()
                                  or not token.isprintable()):
            raise ConfigError("the model proxy's run token must be at least 16 printable "
                              "ASCII characters")
        if max_failures is not None and (not isinstance(max_failures, int)
                                         or isinstance(max_failures, bool) or max_failures < 1):
            raise ConfigError("max_failures must be a positive integer (or None)")
        if budget is not None and (not isinstance(budget, int) or budget < 1):
            raise ConfigError("a token budget must be a positive integer (or None)")
        if idle_timeout <= 0 or connect_timeout <= 0:
            raise ConfigError("model proxy timeouts must be positive")
        self.upstream = upstream
        self.budget = budget
        self.idle_timeout = idle_timeout
        self.connect_timeout = connect_timeout
        self.usage = Usage()
        self.usage_path = Path(usage_path) if usage_path is not None else None
        self.trace_parent: Any = None
        """The trace context ``chat`` spans are children of (the run's, from
        :func:`corral._telemetry.context_of`); ``None``: the current one."""
        self.max_failures = max_failures
        self._failures = 0
        self._last_failure = ""
        self._client: httpx.AsyncClient | None = None
        self._token = token.encode() if token is not None else None
        self.unauthorized = 0
        """Requests refused for want of the run's token (never forwarded or counted)."""

    # ---------------------------------------------------------------- lifecycle

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(self.idle_timeout, connect=self.connect_timeout),
                follow_redirects=False,
                trust_env=False,
                verify=shared_ssl_context(),
            )
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def serve(self, socket_path: str | os.PathLike[str], *,
                    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                    ) -> None:
        """Serve on a unix socket until cancelled (``task_status.started()`` once bound)."""
        self._http()  # now, not on the agent's first request
        try:
            await serve_unix(socket_path, self.handle, task_status=task_status)
        finally:
            with anyio.CancelScope(shield=True):
                await self.aclose()

    # ---------------------------------------------------------------- requests

    def _save_usage(self) -> None:
        if self.usage_path is None:
            return
        tmp = self.usage_path.with_name(self.usage_path.name + ".tmp")
        with contextlib.suppress(OSError):
            tmp.write_text(json.dumps(self.usage.to_dict()))
            os.replace(tmp, self.usage_path)

    def _scrub(self, data: bytes) -> bytes:
        return data.replace(self.upstream.api_key.encode(), b"[redacted]")

    def _failed(self, what: str) -> None:
        self._failures += 1
        self._last_failure = what

    def _authorized(self, request: Request) -> bool:
        """The request carries the run's token as its API key (any of the ways the CLIs
        send one); each candidate is compared in constant time."""
        if self._token is None:
            return True
        candidates = [request.header(h) for h in ("x-api-key", "x-goog-api-key", "api-key")]
        auth = request.header("authorization")
        if auth is not None and auth[:7].lower() == "bearer ":
            candidates.append(auth[7:].strip())
        _path, sep, query = request.target.partition("?")
        if sep:
            candidates += [v for k, v in parse_qsl(query, keep_blank_values=True) if k == "key"]
        found = False
        for value in candidates:
            if value is not None and hmac.compare_digest(value.encode("utf-8", "replace"),
                                                         self._token):
                found = True
        return found

    async def handle(self, request: Request) -> Response:
        """Forward one request (see the module docstring)."""
        refused = self._refused(request)
        if refused is not None:
            return refused
        url = self._target(request)
        if isinstance(url, Response):
            return url
        api = self.upstream.api
        self.usage.requests += 1
        # one "chat" span per model call (GenAI semantic conventions); it ends with the
        # response's stream, carrying the tokens the response reported
        chat = span_at("chat", {"gen_ai.operation.name": "chat",
                                "gen_ai.provider.name": api, "server.address":
                                urlsplit(self.upstream.base_url).hostname or ""},
                       parent=self.trace_parent)
        resp = await self._send(request, url, chat)
        if isinstance(resp, Response):
            return resp
        out_headers = [(k, v) for k, v in resp.headers.multi_items()
                       if k.lower() not in HOP_BY_HOP and k.lower() != "content-encoding"]
        ctype = resp.headers.get("content-type", "")
        if resp.status_code >= 500:
            self._failed(f"status {resp.status_code}")
        else:
            self._failures = 0
        if resp.status_code >= 400:
            return await self._upstream_error(resp, out_headers, chat)
        meter = UsageMeter(api, sse="text/event-stream" in ctype)
        return Response(resp.status_code, out_headers, self._stream(resp, meter, chat))

    def _refused(self, request: Request) -> Response | None:
        """The answer to a request this proxy does not forward at all: not the run's key,
        the token budget used up, the model API failing too often."""
        api = self.upstream.api
        if not self._authorized(request):
            # Before anything else: not forwarded, not counted, not written anywhere.
            self.unauthorized += 1
            return _error(api, 401, "authentication_error",
                          "corral model proxy: this request does not carry this run's key; "
                          "only the run's own sandbox may use its model proxy")
        refusal = None
        if self.budget is not None and self.usage.total >= self.budget:
            refusal = (f"this run's token budget of {self.budget} tokens is used up "
                       f"({self.usage.total} used); no further model requests are allowed")
        elif self.max_failures is not None and self._failures >= self.max_failures:
            refusal = (f"the model API failed {self._failures} times in a row (last: "
                       f"{self._last_failure}); no further model requests are allowed in "
                       "this run")
        if refusal is None:
            return None
        self.usage.refused += 1
        self._save_usage()
        return _error(api, 403, "permission_error", f"corral model proxy: {refusal}")

    def _target(self, request: Request) -> str | Response:
        """The upstream URL of ``request``, or the answer refusing its path."""
        api = self.upstream.api
        try:
            url = self.upstream.url_for(request.target)
        except ConfigError as exc:
            return _error(api, 400, "invalid_request_error", f"corral model proxy: {exc}")
        if not self.upstream.allows(request.target):
            self.usage.refused += 1
            return _error(api, 403, "permission_error",
                          f"corral model proxy: {request.target.split('?', 1)[0]!r} is not a "
                          "model API path this sandbox may call")
        return url

    async def _send(self, request: Request, url: str, chat: span_at
                    ) -> httpx.Response | Response:
        """The upstream's streamed response (with the real key, without the sandbox's
        credentials), or the answer saying it could not be reached."""
        api = self.upstream.api
        headers = [(k, v) for k, v in request.headers
                   if k not in HOP_BY_HOP and k not in CREDENTIAL_HEADERS
                   and k != "accept-encoding"]
        headers += self.upstream.auth_headers()
        headers.append(("accept-encoding", "identity"))
        client = self._http()
        upstream_req = client.build_request(request.method, url, headers=headers,
                                            content=request.body)
        try:
            return await client.send(upstream_req, stream=True)
        except httpx.TimeoutException:
            self._failed(f"no answer within {self.idle_timeout:g}s")
            chat.end(error="timeout")
            self._save_usage()
            return _error(api, 504, "api_error",
                          f"corral model proxy: the model API at {self.upstream.base_url} did "
                          f"not answer within {self.idle_timeout:g}s")
        except httpx.HTTPError as exc:
            self._failed(f"cannot reach it: {exc.__class__.__name__}")
            chat.end(error=exc.__class__.__name__)
            self._save_usage()
            return _error(api, 502, "api_error",
                          f"corral model proxy: cannot reach the model API at "
                          f"{self.upstream.base_url}: {exc.__class__.__name__}: {exc}")

    async def _upstream_error(self, resp: httpx.Response, out_headers: list[tuple[str, str]],
                              chat: span_at) -> Response:
        """An upstream error answer, passed on whole with any key in it scrubbed."""
        try:
            data = self._scrub(await resp.aread())
        except httpx.HTTPError:
            data = _error_body(self.upstream.api, "api_error",
                               "corral model proxy: upstream error body could not be read")
        finally:
            await resp.aclose()
        self._save_usage()
        chat.set("error.type", str(resp.status_code))
        chat.end(error=f"upstream status {resp.status_code}")
        out_headers.append(("content-length", str(len(data))))
        return Response(resp.status_code, out_headers, data)

    async def _stream(self, resp: httpx.Response, meter: UsageMeter,
                      chat: span_at) -> AsyncIterator[bytes]:
        try:
            try:
                async for chunk in resp.aiter_bytes():
                    meter.feed(chunk)
                    yield chunk
            except httpx.TimeoutException:
                if meter.sse:
                    yield _stream_error_frame(
                        self.upstream.api,
                        f"corral model proxy: the model API stalled for "
                        f"{self.idle_timeout:g}s mid-response",
                    )
            except httpx.HTTPError as exc:
                if meter.sse:
                    yield _stream_error_frame(
                        self.upstream.api,
                        f"corral model proxy: the model API connection failed mid-response: "
                        f"{exc.__class__.__name__}",
                    )
        finally:
            with anyio.CancelScope(shield=True):
                await resp.aclose()
            used = meter.finish()
            self.usage.add(used, model=meter.model)
            self._save_usage()
            if meter.model is not None:
                chat.set("gen_ai.response.model", meter.model)
                chat.rename(f"chat {meter.model}")
            chat.set("gen_ai.usage.input_tokens", used.input_tokens + used.cache_read_tokens
                     + used.cache_write_tokens)
            chat.set("gen_ai.usage.output_tokens", used.output_tokens)
            chat.end()
