"""The HTTP service behind ``corral serve``: JSON API, server-sent events, web page.

``create_app(service)`` builds the ASGI app; :func:`corral.server._serve.serve_async` runs it
under uvicorn. See :mod:`corral.server._service` for how runs are driven and watched.
"""

from corral.server._config import SandboxDefinition, ServerConfig
from corral.server._service import RunService

__all__ = ["RunService", "SandboxDefinition", "ServerConfig"]
