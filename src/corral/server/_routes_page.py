"""What the app serves beside the API: the web page (``/``, its files under ``/static``),
the API reference (``/docs`` and ``/redoc``, a page of this package that renders
``/openapi.json``: no CDN, corral may run offline), ``/openapi.json`` itself (a route of the
app, so that a host app's ``auth`` covers it; FastAPI's own skips the app's dependencies),
with the bearer scheme documented when the server has a token, and ``/healthz``."""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any, Final

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse

from corral._version import __version__

__all__ = ["STATIC", "documented_openapi", "router"]

STATIC: Final = Path(str(resources.files("corral.server") / "static"))

router = APIRouter()


@router.get("/", include_in_schema=False)
async def index() -> FileResponse:
    return FileResponse(STATIC / "index.html", headers={"cache-control": "no-store"})


@router.get("/openapi.json", include_in_schema=False)
async def openapi_json(request: Request) -> JSONResponse:
    return JSONResponse(request.app.openapi())


@router.get("/docs", include_in_schema=False)
@router.get("/redoc", include_in_schema=False)
async def docs() -> FileResponse:
    return FileResponse(STATIC / "docs.html", headers={"cache-control": "no-store"})


@router.get("/healthz", include_in_schema=False)
async def health() -> dict[str, Any]:
    return {"ok": True, "version": __version__}


def documented_openapi(app: FastAPI, token: str | None) -> Callable[[], dict[str, Any]]:
    """``app``'s schema builder, documenting the bearer token the guard checks on
    ``/v1/`` when the server has one."""
    base = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = base()
            if token is not None:
                schema.setdefault("components", {})["securitySchemes"] = {
                    "bearer": {"type": "http", "scheme": "bearer",
                               "description": "the server's CORRAL_API_TOKEN"}
                }
                for path, item in schema.get("paths", {}).items():
                    if path.startswith("/v1/"):
                        for operation in item.values():
                            operation["security"] = [{"bearer": []}]
            app.openapi_schema = schema
        return app.openapi_schema

    return openapi
