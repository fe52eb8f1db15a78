"""The command policy: what an agent's commands may run, and where its network may go.

A sandbox definition holds a :class:`Policy` (:class:`corral.Sandbox` ``policy=``); the
policy knows nothing of sandboxes. It is the code that reads hostile strings, so it sits in
one place with its tests (tests/policy/, the differential test against bash among them) and
depends on nothing of corral but its errors and field validators:

- :mod:`~corral.policy._shellparse`: a shell command string → every simple command it would
  run (:mod:`~corral.policy._shelltree`'s values), or
  :class:`~corral.policy._shelltree.ShellParseError` when it cannot be read with certainty;
  its word reader is :mod:`~corral.policy._shellwords`, and what bash evaluates inside data
  (arithmetic, subscripts) is judged by :mod:`~corral.policy._shelleval`;
- :mod:`~corral.policy._parts`: those commands, looked through shells with ``-c``,
  ``eval`` and argv wrappers (``env``, ``sudo``, ``xargs``, …): the parts to judge;
- :mod:`~corral.policy._policy`: :class:`Policy` (allow / ask / deny rules over the parts,
  ``file_write``, ``network``, ``allow_hosts``) and its :class:`Decision`;
- :mod:`~corral.policy._allowlist`: the egress allowlist syntax (``host[:port]``) and which
  addresses are no public destination; the proxy that enforces it is :mod:`corral.net`.

Where it is enforced (command gate hooks, permission prompts, each CLI's own settings) is
the harnesses' business (docs/agents.md, docs/tools.md); what it does and does not stop is
in docs/security.md.
"""

from __future__ import annotations

from corral._lazy import TYPE_CHECKING, lazy_namespace

# The public names, listed once: resolved on first use (corral._lazy)
if TYPE_CHECKING or not lazy_namespace(globals()):
    from corral.policy._policy import (
        Decision as Decision,
        Policy as Policy,
    )
