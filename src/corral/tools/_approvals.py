"""Live approvals for "ask" host tools, kept in the run's store.

When a tool marked ``approval=True`` is called, :class:`Approvals` (the run's
:class:`corral.tools._remote.ApprovalGate`) at once

1. mints an approval id signed with corral's key (:mod:`corral.tools._keys`):
   ``<nonce>.<mac>`` with ``mac = HMAC-SHA256(key, "corral-approval-id" NUL run_id NUL
   nonce)``, so a client cannot forge an id nor replay one against another run;
2. stores the request (:meth:`corral.abc.ApprovalStore.add_approval`);
3. emits ``CUSTOM corral.approval_request`` ``{approvalId, runId, tool, args,
   expiresAt}`` through the run's ``emit`` hook;

and holds the call until an answer is stored (it looks every :data:`POLL` seconds) or the
timeout passes (then it stores a ``timeout`` answer; the store keeps the first answer, so
a human's that landed just before stands). It finally emits ``CUSTOM
corral.approval_resolved`` ``{approvalId, decision, reason}``.

:func:`answer_approval` (``corral approve RUN_ID APPROVAL_ID --allow|--deny``, ``POST
/v1/runs/{id}/approvals/{approval_id}``) verifies the signature and run binding, requires a
pending request, and stores the answer: the first answer wins, a later one is an error
naming the first.

A call with an id (:meth:`Approvals.request`) has an id derived from the run, the call id,
the tool and its arguments: the same question asked again — by the ACP bridge, which
outlives a driver that died or stopped while it waited — finds the first request (and an
answer given meanwhile, with no driver) instead of raising a second one. Such a request
stays pending when its driver goes, until it expires (then it leaves the pending list and
an answer is refused). (So an agent that repeats a call
id with identical arguments gets the answer given to the first: the same command, approved
or refused once.)

The store is the channel: any process on any host that opens the same store (``--store``,
``CORRAL_STORE``) and holds the same key lists and answers a run's approvals, wherever the
run is driven.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import inspect
import json
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal, Protocol

import anyio
from ag_ui.core import BaseEvent, CustomEvent

from corral._errors import CorralError
from corral.stores._protocols import (
    ApprovalAnswer,
    ApprovalRequest,
    ApprovalStore,
    SecretStore,
    UnknownApproval,
)
from corral.tools._keys import b64, corral_key

__all__ = [
    "APPROVAL_REQUEST_EVENT",
    "APPROVAL_RESOLVED_EVENT",
    "FRONTEND_PREFIX",
    "ApprovalChannel",
    "ApprovalError",
    "ApprovalSigner",
    "Approvals",
    "answer_approval",
    "list_pending",
]

APPROVAL_REQUEST_EVENT = "corral.approval_request"
APPROVAL_RESOLVED_EVENT = "corral.approval_resolved"
FRONTEND_PREFIX = "frontend:"
"""The stored ``tool`` of a frontend tool call (an AG-UI client runs the tool): kept with
the approvals (any host can answer it) but never listed or answered as one. Host tool names
have no ``:``."""
Decision = Literal["allow", "deny", "timeout"]
Emit = Callable[[BaseEvent], Awaitable[None] | None]
POLL = 0.1
"""Seconds between looks for an answer (another process, maybe on another host, stores
it)."""
CANCEL_WRITE_TIMEOUT = 5.0
"""Seconds a cancelled call spends recording that nobody waits any more."""


class ApprovalChannel(ApprovalStore, SecretStore, Protocol):
    """What approvals need of a store: the requests and answers, and corral's key."""


class ApprovalError(CorralError):
    """An approval answer was refused (forged id, other run, unknown, already answered)."""


class ApprovalSigner:
    """Mints and verifies approval ids bound to a run with corral's key."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ApprovalError("the approval secret must be at least 16 bytes")
        self._secret = secret

    @classmethod
    async def for_store(cls, store: SecretStore) -> ApprovalSigner:
        """The signer every host of ``store`` shares (``CORRAL_SECRET`` or the store's
        key: :func:`corral.tools._keys.corral_key`)."""
        return cls(await corral_key(store))

    def _mac(self, run_id: str, nonce: str) -> str:
        message = f"corral-approval-id\0{run_id}\0{nonce}".encode("utf-8", "surrogatepass")
        return b64(hmac.new(self._secret, message, hashlib.sha256).digest()[:18])

    def new_id(self, run_id: str) -> str:
        """A fresh approval id for ``run_id``."""
        nonce = b64(secrets.token_bytes(12))
        while nonce.startswith("-"):  # an id is a CLI argument: never like an option
            nonce = b64(secrets.token_bytes(12))
        return f"{nonce}.{self._mac(run_id, nonce)}"

    def id_for_call(self, run_id: str, call_id: str, tool: str, args: Any) -> str:
        """The approval id of one tool call: the same for the same run, call id, tool and
        arguments (see :meth:`Approvals.hold`), unguessable without the key."""
        message = json.dumps(["corral-approval-call", run_id, call_id, tool, args],
                             sort_keys=True, default=str).encode("utf-8", "surrogatepass")
        nonce = b64(hmac.new(self._secret, message, hashlib.sha256).digest()[:12])
        if nonce.startswith("-"):  # an id is a CLI argument: never like an option
            nonce = "A" + nonce[1:]
        return f"{nonce}.{self._mac(run_id, nonce)}"

    def verify(self, run_id: str, approval_id: str) -> bool:
        """Whether ``approval_id`` was minted with this key for ``run_id``."""
        nonce, sep, mac = approval_id.partition(".")
        if not sep or not nonce or not mac or len(approval_id) > 100:
            return False
        return hmac.compare_digest(mac.encode(), self._mac(run_id, nonce).encode())


class Approvals:
    """The approval gate of one run (see the module docstring): requests and answers live
    in ``store``. ``emit`` receives the CUSTOM events (sync or async callable);
    ``timeout`` is how long a call waits; ``signer`` defaults to the store's
    (:meth:`ApprovalSigner.for_store`); ``redact`` rewrites a call's arguments before
    they are stored or shown (the run's secrets: the arguments are the agent's)."""

    def __init__(self, store: ApprovalChannel, run_id: str, *, emit: Emit | None = None,
                 timeout: float = 300.0, signer: ApprovalSigner | None = None,
                 poll: float = POLL, redact: Callable[[Any], Any] | None = None) -> None:
        self.store = store
        self.run_id = run_id
        self.emit = emit
        self.timeout = timeout
        self.signer = signer
        self.poll = poll
        self.redact = redact

    async def _emit(self, name: str, value: dict[str, Any]) -> None:
        if self.emit is None:
            return
        out = self.emit(CustomEvent(name=name, value=value))
        if inspect.isawaitable(out):
            await out

    async def _answer(self, approval_id: str) -> ApprovalAnswer:
        """Wait until the request is answered."""
        while True:
            got = await self.store.get_approval(self.run_id, approval_id)
            if got is None:  # the store lost it (replaced, wiped): nobody can answer now
                return ApprovalAnswer("deny", "the approval request is gone from the store",
                                      time.time())
            if got[1] is not None:
                return got[1]
            await anyio.sleep(self.poll)

    async def hold(self, tool: str, args: Any, *, call_id: str | None = None,
                   events: tuple[str, str] = (APPROVAL_REQUEST_EVENT, APPROVAL_RESOLVED_EVENT),
                   announce: dict[str, Any] | None = None, by_call: bool = False
                   ) -> tuple[str, ApprovalAnswer]:
        """Store a request, emit ``events[0]``, wait for its answer (or the timeout), emit
        ``events[1]``; returns the request's id and the answer that stands. ``announce``
        adds fields to the request event (a frontend call's ``toolCallId``). ``by_call``
        (with ``call_id``): the request's id derives from the run, call id, tool and
        arguments, so the same question asked again (by a durable caller whose driver died
        while it waited) finds the first request and its answer instead of a new one."""
        if self.signer is None:
            self.signer = await ApprovalSigner.for_store(self.store)
        held: tuple[ApprovalRequest, ApprovalAnswer | None] | None = None
        durable = by_call and call_id is not None
        if by_call and call_id is not None:
            approval_id = self.signer.id_for_call(self.run_id, call_id, tool, args)
            held = await self.store.get_approval(self.run_id, approval_id)
        else:
            approval_id = self.signer.new_id(self.run_id)
        answer: ApprovalAnswer | None = None
        if held is not None:
            # The same call asked before, by a driver that died holding it (a durable
            # caller, the ACP bridge, asks its successor again): that request's answer, or
            # the rest of its wait; it was announced once already.
            answer = held[1]
            wait = max(0.0, held[0].expires_at - time.time())
        else:
            wait = self.timeout
            now = time.time()
            shown = self.redact(args) if self.redact is not None else args
            await self.store.add_approval(ApprovalRequest(
                approval_id, self.run_id, tool, shown, now, now + self.timeout,
                call_id=call_id))
            await self._emit(events[0], {
                "approvalId": approval_id, "runId": self.run_id, "tool": tool, "args": shown,
                "expiresAt": now + self.timeout, **(announce or {})})
        try:
            if answer is None:
                with anyio.move_on_after(wait):
                    answer = await self._answer(approval_id)
            if answer is None:  # timed out: record it, unless an answer won the race
                answer = await self.store.answer_approval(self.run_id, approval_id,
                    ApprovalAnswer("timeout", f"no answer within {self.timeout:g}s",
                                   time.time()))
        finally:
            if answer is None and not durable:
                # The call ended without an answer (cancelled: the agent hung up, the
                # driver stopped): record that nobody waits, so the request leaves the
                # pending list and a late answer is refused instead of going nowhere. A
                # call asked by its id stays pending until it expires: its durable caller
                # asks the next driver the same question, and an answer given meanwhile
                # must be there for it.
                with anyio.CancelScope(shield=True), anyio.move_on_after(
                        CANCEL_WRITE_TIMEOUT), contextlib.suppress(CorralError):
                    await self.store.answer_approval(self.run_id, approval_id,
                        ApprovalAnswer("timeout", "the tool call ended before an answer",
                                       time.time()))
        assert answer is not None  # set unless the block above raised
        await self._emit(events[1], {"approvalId": approval_id, "decision": answer.decision,
                                     "reason": answer.reason if events[1] ==
                                     APPROVAL_RESOLVED_EVENT else _short(answer.reason)})
        return approval_id, answer

    async def request(self, tool: str, args: Any, *, call_id: str | None = None
                      ) -> str | None:
        """Ask, wait, and return ``None`` when allowed or the denial reason."""
        announce = {"toolCallId": call_id} if call_id is not None else None
        _id, answer = await self.hold(tool, args, call_id=call_id, announce=announce,
                                      by_call=True)
        if answer.decision == "allow":
            return None
        if answer.decision == "timeout":
            return str(answer.reason)
        reason = answer.reason
        return f"denied by a human{': ' + reason if reason else ''}"


def _short(text: str | None, limit: int = 200) -> str | None:
    """A frontend tool's result in its resolved event: the start only (the agent's tool
    result event carries it whole)."""
    if text is None or len(text) <= limit:
        return text
    return text[:limit] + "..."


async def list_pending(store: ApprovalStore, run_id: str) -> list[ApprovalRequest]:
    """Pending approval requests of a run, oldest first (:class:`corral.stores.ApprovalRequest`:
    id, run, tool, args, created and expiry times, the tool call's id). Frontend tool
    calls waiting for an AG-UI client's result (kept alongside) are not approvals."""
    now = time.time()  # an expired one has no caller waiting any more
    return [r for r in await store.list_pending_approvals(run_id)
            if not r.tool.startswith(FRONTEND_PREFIX) and r.expires_at > now]


async def answer_approval(store: ApprovalChannel, run_id: str, approval_id: str, allow: bool,
                          *, reason: str | None = None,
                          signer: ApprovalSigner | None = None) -> None:
    """Answer a pending approval of ``run_id``. Raises :class:`ApprovalError` for an id not
    minted with corral's key for this run, an unknown request, or one already answered."""
    signer = signer or await ApprovalSigner.for_store(store)
    if not signer.verify(run_id, approval_id):
        raise ApprovalError(f"approval id {approval_id!r} is not valid for run {run_id!r} "
                            "(forged, mistyped, or from another run); copy it from the "
                            "corral.approval_request event")
    missing = ApprovalError(f"no pending approval {approval_id} in run {run_id!r} (the call "
                            "ended, or the run is gone)")
    got = await store.get_approval(run_id, approval_id)
    if got is None:
        raise missing
    if got[0].tool.startswith(FRONTEND_PREFIX):
        raise ApprovalError(f"{approval_id} is a frontend tool call, not an approval: the "
                            "AG-UI client answers it with the tool's result (POST /v1/agui)")
    if got[1] is not None:
        raise ApprovalError(f"approval {approval_id} was already answered: {got[1].decision}")
    now = time.time()
    if got[0].expires_at <= now:
        # nobody waited for it to the end (its caller never came back): too late now
        await store.answer_approval(run_id, approval_id, ApprovalAnswer(
            "timeout", "no answer before the request expired", now))
        raise ApprovalError(f"approval {approval_id} expired unanswered; the tool call was "
                            "refused (the agent may ask again)")
    ours = ApprovalAnswer("allow" if allow else "deny", reason, now)
    try:
        standing = await store.answer_approval(run_id, approval_id, ours)
    except UnknownApproval:
        raise missing from None
    if standing != ours:  # another answer landed between the look and ours
        raise ApprovalError(f"approval {approval_id} was already answered: "
                            f"{standing.decision}")
