"""The HTTP service behind ``corral serve``: JSON API, server-sent events, web page.

:func:`create_app` builds the ASGI app (:class:`CorralApp`), to serve alone or to mount in
a web app (docs/embedding.md); :func:`serve_async` runs it under uvicorn.
:func:`add_serve_options` and :func:`config_from_args` are the command-line options
``corral serve`` and ``python -m corral.server`` share.
"""

from __future__ import annotations

from corral._lazy import TYPE_CHECKING, lazy_namespace

# The public names, listed once: resolved on first use (corral._lazy)
if TYPE_CHECKING or not lazy_namespace(globals()):
    from corral.server._app import (
        CorralApp as CorralApp,
        create_app as create_app,
    )
    from corral.server._config import (
        SandboxDefinition as SandboxDefinition,
        ServerConfig as ServerConfig,
        load_config_file as load_config_file,
    )
    from corral.server._serve_cli import (
        add_serve_options as add_serve_options,
        config_from_args as config_from_args,
    )
    from corral.server._serve import serve_async as serve_async
    from corral.server._service import (
        RunService as RunService,
        TooManyRuns as TooManyRuns,
    )
