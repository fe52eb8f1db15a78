"""The HTTP service behind ``corral serve``: JSON API, server-sent events, web page.

:func:`create_app` builds the ASGI app (:class:`CorralApp`), to serve alone or to mount in
a web app (docs/embedding.md); :func:`serve_async` runs it under uvicorn.
:func:`add_serve_options` and :func:`config_from_args` are the command-line options
``corral serve`` and ``python -m corral.server`` share.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from corral._lazy import lazy_exports

if TYPE_CHECKING:
    from corral.server._app import CorralApp, create_app
    from corral.server._config import SandboxDefinition, ServerConfig, load_config_file
    from corral.server._command import add_serve_options, config_from_args
    from corral.server._serve import serve_async
    from corral.server._service import RunService, TooManyRuns

# Names resolve on first use (corral._lazy).
_EXPORTS: dict[str, str] = {
    "CorralApp": "corral.server._app",
    "create_app": "corral.server._app",
    "SandboxDefinition": "corral.server._config",
    "ServerConfig": "corral.server._config",
    "load_config_file": "corral.server._config",
    "add_serve_options": "corral.server._command",
    "config_from_args": "corral.server._command",
    "serve_async": "corral.server._serve",
    "RunService": "corral.server._service",
    "TooManyRuns": "corral.server._service",
}

__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)

__all__ = [
    "CorralApp",
    "RunService",
    "SandboxDefinition",
    "ServerConfig",
    "TooManyRuns",
    "add_serve_options",
    "config_from_args",
    "create_app",
    "load_config_file",
    "serve_async",
]
