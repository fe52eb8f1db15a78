"""How the API answers an error: one JSON body, ``{"error": {"code", "message",
"details"?}}``, for a refused request (422 with the fields at fault), an ``HTTPException``,
an :class:`~corral.server._requests.ApiError`, and each corral exception a route lets
through (the status and code per class below); the ``responses`` entries that document
those answers in the OpenAPI schema."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from corral._errors import ConfigError, CorralError, PrerequisiteMissing
from corral._log import library_logger
from corral.runs._runner import RunStartError
from corral.runs._threads import ThreadBusy, ThreadError, UnknownThread
from corral.sandbox._contracts import UnsupportedCapability
from corral.server._models import ErrorBody
from corral.server._requests import ApiError
from corral.server._service import TooManyRuns
from corral.stores._protocols import RunExists, UnknownRun

__all__ = ["add_error_handlers", "responses"]

log = library_logger("corral.server._http_errors")

ERROR_CODES: Final = {
    400: "invalid_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "body_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    429: "too_many_runs",
}

# Starlette picks a handler by the exception's class, most specific first.
_MAPPED: Final[dict[type[Exception], tuple[int, str]]] = {
    UnknownRun: (404, "run_not_found"), RunExists: (409, "run_exists"),
    TooManyRuns: (429, "too_many_runs"), RunStartError: (500, "run_start_failed"),
    ConfigError: (400, "invalid_request"),
    UnknownThread: (404, "thread_not_found"), ThreadBusy: (409, "thread_busy"),
    ThreadError: (409, "thread_refused"),
}


def error(status: int, code: str, message: str, details: Any = None,
          headers: dict[str, str] | None = None) -> JSONResponse:
    """The JSON error answer."""
    body: dict[str, Any] = {"code": code, "message": message}
    if details is not None:
        body["details"] = details
    return JSONResponse({"error": body}, status_code=status, headers=headers)


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """A route's documented error answers (its OpenAPI ``responses``)."""
    return {s: {"model": ErrorBody, "description": ERROR_CODES.get(s, "error")}
            for s in statuses}


def _describe_validation(exc: RequestValidationError) -> tuple[str, list[dict[str, Any]]]:
    details: list[dict[str, Any]] = []
    parts: list[str] = []
    for err in exc.errors():
        loc = [str(p) for p in err.get("loc", ()) if p != "body" or len(err.get("loc", ())) == 1]
        where = ".".join(loc) or "body"
        msg = str(err.get("msg", "invalid"))
        details.append({"loc": loc, "message": msg, "type": str(err.get("type", ""))})
        parts.append(f"{where}: {msg}")
    message = "invalid request: " + "; ".join(parts[:5])
    if len(parts) > 5:
        message += f" (and {len(parts) - 5} more)"
    return message, details


async def _on_validation(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    message, details = _describe_validation(exc)
    return error(422, "invalid_request", message, details)


async def _on_http(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    return error(exc.status_code, ERROR_CODES.get(exc.status_code, "error"),
                 str(exc.detail), headers=dict(exc.headers or {}))


async def _on_api(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return error(exc.status, exc.code, exc.message)


def _mapped(status: int, code: str) -> Callable[[Request, Exception], Awaitable[JSONResponse]]:
    async def handle(_: Request, exc: Exception) -> JSONResponse:
        return error(status, code, str(exc))

    return handle


async def _on_missing(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, PrerequisiteMissing)
    # the server's machine lacks something (an agent CLI, a model key, a Docker daemon):
    # the operator's to fix, not a bug of the server
    log.warning("request refused: %s", exc)
    return error(503, exc.code, str(exc))


async def _on_unsupported(_: Request, exc: Exception) -> JSONResponse:
    log.warning("request refused: %s", exc)
    return error(400, "unsupported", str(exc))


async def _on_corral(_: Request, exc: Exception) -> JSONResponse:
    log.error("request failed: %s", exc)
    return error(500, "internal", str(exc))


async def _on_bug(_: Request, exc: Exception) -> JSONResponse:
    log.error("unexpected error: %s", exc, exc_info=exc)
    return error(500, "internal", "internal error; the server log has the details")


def add_error_handlers(app: FastAPI) -> None:
    """Make ``app`` answer every error with the JSON error body."""
    app.add_exception_handler(RequestValidationError, _on_validation)
    app.add_exception_handler(StarletteHTTPException, _on_http)
    app.add_exception_handler(ApiError, _on_api)
    for exc_type, (status, code) in _MAPPED.items():
        app.add_exception_handler(exc_type, _mapped(status, code))
    app.add_exception_handler(PrerequisiteMissing, _on_missing)
    app.add_exception_handler(UnsupportedCapability, _on_unsupported)
    app.add_exception_handler(CorralError, _on_corral)
    app.add_exception_handler(Exception, _on_bug)
