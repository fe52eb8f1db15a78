"""corral's loggers. The library never prints on its own: the ``corral`` logger has a
:class:`logging.NullHandler`, so a warning in a program that configured no logging is not
written to stderr by logging's last-resort handler; a program that configures logging (the
``corral`` command does, ``logging.basicConfig`` does) sees every record as before.

Every module that logs gets its logger here, so the handler is in place before its first
record. (Not in ``corral/__init__``: importing :mod:`logging` would slow ``corral --version``.)
"""

from __future__ import annotations

import logging

__all__ = ["library_logger"]

_ROOT = logging.getLogger("corral")
if not any(isinstance(h, logging.NullHandler) for h in _ROOT.handlers):
    _ROOT.addHandler(logging.NullHandler())


def library_logger(name: str) -> logging.Logger:
    """The logger ``name`` (``corral.…``); see the module's docstring."""
    return logging.getLogger(name)
