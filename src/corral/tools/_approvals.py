"""Live approvals for "ask" host tools.

When a tool marked ``approval=True`` is called, :class:`Approvals` (the run's
:class:`corral.tools._remote.ApprovalGate`) at once

1. mints an approval id signed by the host: ``<nonce>.<mac>`` with
   ``mac = HMAC-SHA256(server secret, run_id NUL nonce)``, so a client cannot forge an id
   nor replay one against another run;
2. writes the request to ``$CORRAL_HOME/approvals/<run digest>/<id>.request.json``
   (atomically: temporary file + rename);
3. emits ``CUSTOM corral.approval_request`` ``{approvalId, runId, tool, args,
   expiresAt}`` through the run's ``emit`` hook;

and holds the call until an answer file ``<id>.answer.json`` appears or the timeout
passes (then the call is denied and a ``timeout`` answer is recorded). It finally emits
``CUSTOM corral.approval_resolved`` ``{approvalId, decision, reason}``.

:func:`answer_approval` (used by ``corral approve RUN_ID APPROVAL_ID --allow|--deny`` from
any process on the host) verifies the signature and run binding, requires a pending
request, and creates the answer file exclusively: the first answer wins, a second one is
an error naming the first.

Files are the channel because they need no server: any process of the same host user can
answer, and a run taken over by another process keeps its pending ids readable. (A run
driven from several hosts needs a shared ``$CORRAL_HOME`` for this channel.)
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import inspect
import json
import os
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import anyio
from ag_ui.core import BaseEvent, CustomEvent

from corral._errors import CorralError
from corral._paths import corral_home

__all__ = [
    "APPROVAL_REQUEST_EVENT",
    "APPROVAL_RESOLVED_EVENT",
    "ApprovalError",
    "ApprovalSigner",
    "Approvals",
    "PendingApproval",
    "answer_approval",
    "approvals_root",
    "list_pending",
]

APPROVAL_REQUEST_EVENT = "corral.approval_request"
APPROVAL_RESOLVED_EVENT = "corral.approval_resolved"
Decision = Literal["allow", "deny", "timeout"]
Emit = Callable[[BaseEvent], Awaitable[None] | None]
POLL = 0.05
"""Seconds between looks for an answer (a file another process writes)."""


class ApprovalError(CorralError):
    """An approval answer was refused (forged id, other run, unknown, already answered)."""


def approvals_root(root: Path | None = None) -> Path:
    """``$CORRAL_HOME/approvals`` (created 0700)."""
    d = root if root is not None else corral_home() / "approvals"
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    return d


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class ApprovalSigner:
    """Mints and verifies approval ids bound to a run with a host secret."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ApprovalError("the approval secret must be at least 16 bytes")
        self._secret = secret

    @classmethod
    def from_home(cls, root: Path | None = None) -> ApprovalSigner:
        """The host's signer; its secret is ``<approvals root>/secret`` (0600, made once,
        never inside a sandbox)."""
        path = approvals_root(root) / "secret"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        else:  # first use: write a fresh secret (racers read it after the rename below)
            tmp = path.with_name(f"secret.{secrets.token_hex(4)}.tmp")
            os.close(fd)
            tmp.write_bytes(secrets.token_bytes(32))
            os.chmod(tmp, 0o600)
            os.replace(tmp, path)
        for _ in range(100):  # a concurrent creator may not have renamed yet
            data = path.read_bytes()
            if data:
                return cls(data)
            time.sleep(0.01)
        raise ApprovalError(f"the approval secret {path} is empty; delete it and retry")

    def derive(self, label: str, run_id: str) -> str:
        """A secret bound to this host's secret, ``label`` and ``run_id`` (the same on every
        call: a process taking a run over on this host derives the same value)."""
        return _b64(hmac.new(self._secret, f"{label}\0{run_id}".encode(),
                             hashlib.sha256).digest())

    def _mac(self, run_id: str, nonce: str) -> str:
        return _b64(hmac.new(self._secret, f"{run_id}\0{nonce}".encode(),
                             hashlib.sha256).digest()[:18])

    def new_id(self, run_id: str) -> str:
        """A fresh approval id for ``run_id``."""
        nonce = _b64(secrets.token_bytes(12))
        while nonce.startswith("-"):  # an id is a CLI argument: never like an option
            nonce = _b64(secrets.token_bytes(12))
        return f"{nonce}.{self._mac(run_id, nonce)}"

    def verify(self, run_id: str, approval_id: str) -> bool:
        """Whether ``approval_id`` was minted by this host for ``run_id``."""
        nonce, sep, mac = approval_id.partition(".")
        if not sep or not nonce or not mac or len(approval_id) > 100:
            return False
        return hmac.compare_digest(mac.encode(), self._mac(run_id, nonce).encode())


def _run_dir(root: Path, run_id: str) -> Path:
    return root / hashlib.sha256(run_id.encode()).hexdigest()[:32]


def _write_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    tmp.write_text(json.dumps(data, sort_keys=True))
    os.replace(tmp, path)


def _create_exclusive(path: Path, data: dict[str, Any]) -> bool:
    """Write ``path`` complete and only if absent (link of a finished temp file)."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    tmp.write_text(json.dumps(data, sort_keys=True))
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink()


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@dataclass(frozen=True, slots=True)
class PendingApproval:
    """An approval request waiting for an answer."""

    approval_id: str
    run_id: str
    tool: str
    args: Any
    created_at: float
    expires_at: float


class Approvals:
    """The approval gate of one run (see the module docstring). ``emit`` receives the
    CUSTOM events (sync or async callable); ``timeout`` is how long a call waits."""

    def __init__(self, run_id: str, *, emit: Emit | None = None, timeout: float = 300.0,
                 root: Path | None = None, signer: ApprovalSigner | None = None) -> None:
        self.run_id = run_id
        self.emit = emit
        self.timeout = timeout
        self.root = approvals_root(root)
        self.signer = signer or ApprovalSigner.from_home(self.root)
        self.dir = _run_dir(self.root, run_id)

    async def _emit(self, name: str, value: dict[str, Any]) -> None:
        if self.emit is None:
            return
        out = self.emit(CustomEvent(name=name, value=value))
        if inspect.isawaitable(out):
            await out

    async def request(self, tool: str, args: Any, *, call_id: str | None = None
                      ) -> str | None:
        """Ask, wait, and return ``None`` when allowed or the denial reason."""
        self.dir.mkdir(mode=0o700, exist_ok=True)
        approval_id = self.signer.new_id(self.run_id)
        now = time.time()
        req = {"approvalId": approval_id, "runId": self.run_id, "tool": tool, "args": args,
               "callId": call_id, "createdAt": now, "expiresAt": now + self.timeout}
        _write_atomic(self.dir / f"{approval_id}.request.json", req)
        await self._emit(APPROVAL_REQUEST_EVENT, {k: req[k] for k in (
            "approvalId", "runId", "tool", "args", "expiresAt")})
        answer_path = self.dir / f"{approval_id}.answer.json"
        answer: dict[str, Any] | None = None
        try:
            with anyio.move_on_after(self.timeout):
                while (answer := _read(answer_path)) is None:
                    await anyio.sleep(POLL)
            if answer is None:  # timed out: record it, unless an answer won the race
                timeout_answer = {"decision": "timeout", "reason": f"no answer within "
                                  f"{self.timeout:g}s", "answeredAt": time.time()}
                if _create_exclusive(answer_path, timeout_answer):
                    answer = timeout_answer
                else:
                    answer = _read(answer_path) or timeout_answer
        finally:
            with contextlib.suppress(OSError):
                (self.dir / f"{approval_id}.request.json").unlink()
        decision = answer.get("decision")
        reason = answer.get("reason")
        await self._emit(APPROVAL_RESOLVED_EVENT, {"approvalId": approval_id,
                                                   "decision": decision, "reason": reason})
        if decision == "allow":
            return None
        if decision == "timeout":
            return str(reason)
        return f"denied by a human{': ' + str(reason) if reason else ''}"


def list_pending(run_id: str, *, root: Path | None = None) -> list[PendingApproval]:
    """Pending approval requests of a run, oldest first."""
    d = _run_dir(approvals_root(root), run_id)
    out: list[PendingApproval] = []
    for p in sorted(d.glob("*.request.json")) if d.is_dir() else []:
        r = _read(p)
        if r is None or (p.parent / p.name.replace(".request.", ".answer.")).exists():
            continue
        out.append(PendingApproval(str(r.get("approvalId")), run_id, str(r.get("tool")),
                                   r.get("args"), float(r.get("createdAt", 0)),
                                   float(r.get("expiresAt", 0))))
    return sorted(out, key=lambda a: a.created_at)


def answer_approval(run_id: str, approval_id: str, allow: bool, *, reason: str | None = None,
                    root: Path | None = None, signer: ApprovalSigner | None = None) -> None:
    """Answer a pending approval of ``run_id``. Raises :class:`ApprovalError` for an id this
    host did not mint for this run, an unknown or expired request, or one already
    answered."""
    base = approvals_root(root)
    signer = signer or ApprovalSigner.from_home(base)
    if not signer.verify(run_id, approval_id):
        raise ApprovalError(f"approval id {approval_id!r} is not valid for run {run_id!r} "
                            "(forged, mistyped, or from another run); copy it from the "
                            "corral.approval_request event")
    d = _run_dir(base, run_id)
    answer_path = d / f"{approval_id}.answer.json"
    if not (d / f"{approval_id}.request.json").exists():
        prior = _read(answer_path)
        if prior is not None:
            raise ApprovalError(f"approval {approval_id} was already answered: "
                                f"{prior.get('decision')}")
        raise ApprovalError(f"no pending approval {approval_id} in run {run_id!r} (the call "
                            "ended, or the run is gone)")
    answer = {"decision": "allow" if allow else "deny", "reason": reason,
              "answeredAt": time.time()}
    if not _create_exclusive(answer_path, answer):
        prior = _read(answer_path) or {}
        raise ApprovalError(f"approval {approval_id} was already answered: "
                            f"{prior.get('decision')}")
