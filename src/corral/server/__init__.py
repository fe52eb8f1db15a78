"""The HTTP service behind ``corral serve``: JSON API, server-sent events, web page.

``create_app(service)`` builds the ASGI app; :func:`corral.server.serve.serve_async` runs it
under uvicorn. See :mod:`corral.server.service` for how runs are driven and watched.
"""

from corral.server.config import SandboxDefinition, ServerConfig
from corral.server.service import RunService

__all__ = ["RunService", "SandboxDefinition", "ServerConfig"]
