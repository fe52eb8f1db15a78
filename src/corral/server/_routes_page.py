"""What the app serves beside the API: the web page (``/``; its files are mounted under
``/static``), the API reference (``/docs`` and ``/redoc``, a page of this package that
renders ``/openapi.json``: no CDN, corral may run offline), ``/openapi.json`` itself (a
route of the app, so that a host app's ``auth`` covers it; FastAPI's own skips the app's
dependencies) and ``/healthz``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse

from corral._version import __version__
from corral.server._routing import STATIC

__all__ = ["router"]

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
