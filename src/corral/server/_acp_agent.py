"""``corral acp``: corral as an Agent Client Protocol agent, for editors (Zed, any ACP client).

The editor starts ``corral acp`` and speaks ACP (newline-delimited JSON-RPC 2.0) on its
stdin/stdout. corral answers as one agent whose work runs as durable corral runs:

- ``initialize``: protocol version 1; ``loadSession``, ``session/resume`` and
  ``session/close`` are supported; prompts may embed context (``resource`` blocks).
- ``session/new`` (``cwd``: the project directory) opens a session; its id is a new corral
  **thread** id. The thread's sandbox holds a copy of ``cwd`` and is kept between prompts
  (``reuse = "thread"``), so each prompt continues where the last one left the files and,
  for agent CLIs, the conversation.
- ``session/prompt`` starts a run of the chosen harness on the thread (the command harness
  runs the prompt as ``sh -c``), and streams its events as ``session/update`` notifications
  (:mod:`corral.server._acp_updates`) until the run ends: ``end_turn`` (completed),
  ``cancelled`` (cancelled), ``refusal`` (failed; the reason is the last message chunk).
- corral's ``ask`` verdicts (pending approvals of the run, read from the store) become
  ``session/request_permission`` requests to the editor; the option chosen answers the
  approval (``allow_once`` allows; anything else, or no answer, denies).
- ``session/cancel`` cancels the running run (:meth:`corral.runs.Runner.cancel`).
- The editor going away (stdin closed) **detaches** running runs: they go on under their
  supervisor. ``session/load`` replays the thread's runs as updates (each prompt as a user
  message) and reattaches to a run still running: its updates and permission requests
  follow. ``session/resume`` reattaches without the replay.

The editor is trusted as the user is (it starts corral with the user's rights); what a run
does is confined by the sandbox and the policy as for ``corral run``.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import anyio
import anyio.abc
import anyio.to_thread

from corral._errors import ConfigError, CorralError, PrerequisiteMissing
from corral._ids import check_id
from corral._log import library_logger
from corral._version import __version__
from corral.runs._request import RunRequest, RunStartError
from corral._paths import corral_home
from corral.runs._file_feed import scan_manifest
from corral.sandbox._contracts import Handle
from corral.server._acp_files import (
    MAX_RELAY,
    EditorTree,
    Refused,
    SyncState,
    changed_files,
    safe_relative,
)
from corral.server._acp_rpc import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    RESOURCE_NOT_FOUND,
    ConnectionGone,
    Rpc,
    RpcError,
    stdio_lines,
)
from corral.server._acp_updates import UpdateTranslator, text_chunk
from corral.server._service import RunService
from corral.stores._records import RunRecord, RunStatus
from corral.tools._approvals import ApprovalError, answer_approval, list_pending

__all__ = ["AcpAgent", "RequestFactory", "SessionRequest"]

log = library_logger("corral.server._acp_agent")

PROTOCOL_VERSION: Final = 1
PERMISSION_POLL: Final = 0.25
"""Seconds between looks for a run's pending approvals (the store is the channel)."""
MAX_PROMPT: Final = 1 << 20


ALLOW_OPTION: Final = "allow"
DENY_OPTION: Final = "deny"


@dataclass(frozen=True, slots=True)
class SessionRequest:
    """What a prompt asks for: the session's directory, its thread and the prompt text."""

    cwd: str
    thread_id: str
    prompt: str


RequestFactory = Callable[[SessionRequest], RunRequest]
"""Builds the run of a prompt (the command line's harness, provider and sandbox)."""


@dataclass
class _Session:
    session_id: str
    cwd: str
    run_id: str | None = None
    """The run this process follows for the session (a prompt's, or one reattached)."""
    follow: anyio.CancelScope | None = None
    followed: anyio.Event | None = None
    """Set when the run reattached by session/load or session/resume has ended."""
    cancelled: bool = False
    asked: set[str] = field(default_factory=set)
    sync: SyncState | None = None
    """What the editor's files were when the editor and the sandbox last agreed
    (:mod:`corral.server._acp_files`)."""


class AcpAgent:
    """One ACP connection (see the module docstring), keeping its runs with ``service``
    (use inside :meth:`RunService.running`); ``make_request`` builds each prompt's run."""

    def __init__(self, service: RunService, make_request: RequestFactory, *,
                 permission_poll: float = PERMISSION_POLL) -> None:
        self.service = service
        self.make_request = make_request
        self.permission_poll = permission_poll
        self.sessions: dict[str, _Session] = {}
        self.editor_writes = False
        """The editor advertised ``fs.writeTextFile``: edits go through it."""
        self._rpc: Rpc | None = None
        self._tg: anyio.abc.TaskGroup | None = None

    # ------------------------------------------------------------------ the connection

    async def serve(self, receive_line: Callable[[], Awaitable[bytes]],
                    send_line: Callable[[bytes], Awaitable[None]]) -> None:
        """Answer the editor until it closes the connection (``receive_line`` returns
        ``b""``); then stop following every run (they go on, detached)."""
        rpc = self._rpc = Rpc(send_line)
        async with anyio.create_task_group() as tg:
            self._tg = tg
            while True:
                line = await receive_line()
                if not line:
                    break
                if not line.strip():
                    continue
                try:
                    message = json.loads(line)
                except ValueError:
                    await self._reply_error(None, PARSE_ERROR, "not JSON")
                    continue
                if not isinstance(message, dict):
                    await self._reply_error(None, INVALID_REQUEST,
                                            "a message must be a JSON object (no batches)")
                    continue
                method = message.get("method")
                if isinstance(method, str):
                    tg.start_soon(self._dispatch, message, method)
                elif "id" in message:
                    rpc.answered(message)
            log.info("the editor closed the connection; runs go on detached")
            rpc.close()
            tg.cancel_scope.cancel()

    async def _reply_error(self, rid: Any, code: int, message: str) -> None:
        assert self._rpc is not None
        try:
            await self._rpc.send({"id": rid, "error": {"code": code, "message": message}})
        except ConnectionGone:
            pass

    async def _dispatch(self, message: dict[str, Any], method: str) -> None:
        assert self._rpc is not None
        rid = message.get("id")
        params = message.get("params")
        if params is None:
            params = {}
        is_request = "id" in message
        try:
            if not isinstance(params, dict):
                raise RpcError(INVALID_PARAMS, "params must be an object")
            handler = _HANDLERS.get(method)
            if handler is None:
                if is_request:
                    raise RpcError(METHOD_NOT_FOUND, f"method {method!r} is not supported")
                return
            result = await handler(self, params)
        except RpcError as exc:
            if is_request:
                await self._reply_error(rid, exc.code, exc.message)
            return
        except ConnectionGone:
            return
        except (ConfigError, PrerequisiteMissing, RunStartError) as exc:
            if is_request:
                await self._reply_error(rid, INVALID_PARAMS if isinstance(exc, ConfigError)
                                        else INTERNAL_ERROR, str(exc))
            return
        except Exception as exc:  # noqa: BLE001 - one request's failure is the editor's to see
            log.error("%s failed: %s", method, exc, exc_info=exc)
            if is_request:
                await self._reply_error(rid, INTERNAL_ERROR, f"{method} failed: {exc}")
            return
        if is_request:
            try:
                await self._rpc.send({"id": rid, "result": result if result is not None
                                      else {}})
            except ConnectionGone:
                pass

    async def _update(self, session_id: str, update: dict[str, Any]) -> None:
        assert self._rpc is not None
        await self._rpc.notify("session/update", {"sessionId": session_id, "update": update})

    # ------------------------------------------------------------------ handlers

    async def initialize(self, params: dict[str, Any]) -> dict[str, Any]:
        caps = params.get("clientCapabilities")
        fs = caps.get("fs") if isinstance(caps, dict) else None
        self.editor_writes = isinstance(fs, dict) and fs.get("writeTextFile") is True
        return {
            "protocolVersion": PROTOCOL_VERSION,
            "agentCapabilities": {
                "loadSession": True,
                "promptCapabilities": {"image": False, "audio": False,
                                       "embeddedContext": True},
                "mcpCapabilities": {"http": False, "sse": False},
                "sessionCapabilities": {"resume": {}, "close": {}},
            },
            "agentInfo": {"name": "corral", "title": "corral", "version": __version__},
            "authMethods": [],
        }

    async def new_session(self, params: dict[str, Any]) -> dict[str, Any]:
        cwd = _cwd(params)
        session_id = "acp-" + uuid.uuid4().hex[:20]
        self.sessions[session_id] = _Session(session_id, cwd)
        return {"sessionId": session_id}

    async def load_session(self, params: dict[str, Any]) -> dict[str, Any]:
        session = self._reopen(params)
        runs = await self.service.store.list_by_thread(session.session_id)
        active: tuple[RunRecord, int, UpdateTranslator] | None = None
        for record in runs:
            translator = UpdateTranslator(session.cwd, replay=True)
            if record.harness == "command":
                argv = (record.spec or {}).get("argv")
                if isinstance(argv, list) and argv:
                    await self._update(session.session_id,
                                       text_chunk("user_message_chunk", str(argv[-1])))
            last = 0
            for logged in await self.service.store.snapshot(record.run_id):
                last = logged.offset
                for update in translator.updates(logged.event):
                    await self._update(session.session_id, update)
            if not record.terminal:
                translator.replay = False
                active = (record, last, translator)
        if active is not None:
            self._reattach(session, *active)
        return {}

    async def resume_session(self, params: dict[str, Any]) -> dict[str, Any]:
        session = self._reopen(params)
        record = await self.service.store.find_active_run(session.session_id)
        if record is not None:
            tail = await self.service.store.tail(record.run_id)
            self._reattach(session, record, tail.last_offset, UpdateTranslator(session.cwd))
        return {}

    async def close_session(self, params: dict[str, Any]) -> dict[str, Any]:
        session = self._session(params)
        await self._cancel_run(session)
        if session.follow is not None:
            session.follow.cancel()
        self.sessions.pop(session.session_id, None)
        return {}

    async def cancel(self, params: dict[str, Any]) -> None:
        session = self.sessions.get(str(params.get("sessionId")))
        if session is not None:
            await self._cancel_run(session)

    async def prompt(self, params: dict[str, Any]) -> dict[str, Any]:
        session = self._session(params)
        text = _prompt_text(params.get("prompt"))
        if session.followed is not None:
            # A run from before the editor reopened the session still goes on: the prompt
            # is its next turn (session/cancel ends that run first).
            await session.followed.wait()
        if session.run_id is not None or await self.service.store.find_active_run(
                session.session_id) is not None:
            raise RpcError(INVALID_REQUEST, "this session's previous prompt is still running; "
                           "cancel it (session/cancel) or wait for its end")
        request = self.make_request(SessionRequest(session.cwd, session.session_id, text))
        await self._synced(session)  # before the run copies the directory
        session.cancelled = False
        try:
            record = await self.service.start_run(request)
        except (RunStartError, ConfigError, PrerequisiteMissing, CorralError) as exc:
            await self._update(session.session_id, text_chunk(
                "agent_message_chunk", f"corral could not start the run: {exc}"))
            return {"stopReason": "refusal"}
        session.run_id = record.run_id
        try:
            final = await self._follow(session, record.run_id, 0,
                                       UpdateTranslator(session.cwd))
        finally:
            session.run_id = None
        await self._relay(session, final)
        return {"stopReason": _stop_reason(final, session.cancelled)}

    # ------------------------------------------------------------------ sessions and runs

    def _session(self, params: dict[str, Any]) -> _Session:
        sid = params.get("sessionId")
        session = self.sessions.get(sid) if isinstance(sid, str) else None
        if session is None:
            raise RpcError(RESOURCE_NOT_FOUND, f"no session {sid!r} here: session/new, or "
                           "session/load to reopen one")
        return session

    def _reopen(self, params: dict[str, Any]) -> _Session:
        sid = params.get("sessionId")
        if not isinstance(sid, str):
            raise RpcError(INVALID_PARAMS, "sessionId must be a string")
        try:
            check_id(sid, "sessionId")
        except ConfigError as exc:
            raise RpcError(INVALID_PARAMS, str(exc)) from None
        cwd = _cwd(params)
        session = self.sessions.get(sid)
        if session is None:
            session = self.sessions[sid] = _Session(sid, cwd)
        return session

    def _reattach(self, session: _Session, record: RunRecord, after: int,
                  translator: UpdateTranslator) -> None:
        """Follow a run still running (an earlier connection's) in the background: its
        updates and permission requests come as they happen."""
        if session.run_id is not None or self._tg is None:
            return
        session.run_id = record.run_id
        followed = session.followed = anyio.Event()

        async def follow() -> None:
            try:
                final = await self._follow(session, record.run_id, after, translator)
                await self._relay(session, final)
            except ConnectionGone:
                pass
            finally:
                session.run_id = None
                session.followed = None
                followed.set()

        self._tg.start_soon(follow)

    # ------------------------------------------------------------------ the editor's files

    def _sync_file(self, session: _Session) -> Path:
        return corral_home() / "acp" / f"{session.session_id}.json"

    async def _synced(self, session: _Session) -> SyncState:
        """The session's :class:`SyncState`: kept, else saved with it, else (the session's
        first prompt, before its run copies the directory) the directory as it is now."""
        if session.sync is None:
            where = self._sync_file(session)
            found = await anyio.to_thread.run_sync(SyncState.load, where)
            if found is None:
                found = SyncState(await anyio.to_thread.run_sync(scan_manifest, session.cwd))
                await anyio.to_thread.run_sync(found.save, where)
            session.sync = found
        return session.sync

    async def _relay(self, session: _Session, record: RunRecord | None) -> None:
        """Bring the files the run changed in its sandbox into the editor's directory
        (:mod:`corral.server._acp_files`); what is not brought over is named to the user."""
        if record is None:
            return
        changes, odd = changed_files(
            e.event for e in await self.service.store.snapshot(record.run_id))
        problems = [f"{p}: its name is not UTF-8" for p in odd]
        if not changes and not problems:
            return
        sync = await self._synced(session)
        tree = EditorTree(session.cwd)
        handle = None
        if any(c.kind != "delete" for c in changes):
            handle = await self.service.runner.sandbox_of(record)
            if handle is None:
                if not session.cancelled:
                    problems.append("the run's sandbox is gone: its changes could not be "
                                    "brought into your files")
                changes = [c for c in changes if c.kind == "delete"]
        for change in changes:
            try:
                rel = safe_relative(change.path)
                await self._relay_one(session, tree, sync, handle, change.kind, rel)
            except Refused as exc:
                problems.append(f"{change.path[:300]}: {exc}")
            except (OSError, CorralError) as exc:
                problems.append(f"{change.path[:300]}: {exc}")
        await anyio.to_thread.run_sync(sync.save, self._sync_file(session))
        if problems:
            await self._update(session.session_id, text_chunk(
                "agent_message_chunk", "\n[corral: not brought into your files: "
                + "; ".join(problems[:50])
                + (f"; and {len(problems) - 50} more" if len(problems) > 50 else "")
                + "]\n"))

    async def _relay_one(self, session: _Session, tree: EditorTree, sync: SyncState,
                         handle: Handle | None, kind: str, rel: str) -> None:
        now = await anyio.to_thread.run_sync(tree.state, rel)
        known = sync.files.get(rel)
        if kind == "delete":
            if now is None:
                sync.files.pop(rel, None)
            elif now != known:
                raise Refused(KEPT)
            else:
                await anyio.to_thread.run_sync(tree.delete, rel)
                sync.files.pop(rel, None)
            return
        assert handle is not None
        try:
            info = await handle.fs.stat(rel)
        except FileNotFoundError:
            return  # gone since (its deletion came as an event too, or it never stayed)
        if info.type != "file":
            raise Refused(f"a {info.type} in the sandbox, not a regular file: not brought "
                          "over")
        if info.size > MAX_RELAY:
            raise Refused(f"{info.size} bytes, more than corral brings over "
                          f"({MAX_RELAY}); it is in the session's sandbox")
        data = await handle.fs.read(rel)
        if len(data) > MAX_RELAY:
            raise Refused(f"more than {MAX_RELAY} bytes; it is in the session's sandbox")
        if now is not None and await anyio.to_thread.run_sync(tree.read, rel) == data:
            sync.files[rel] = now  # already what the agent made
            return
        if now != known:
            raise Refused(KEPT)
        text = _utf8(data)
        if self.editor_writes and text is not None and self._rpc is not None:
            await anyio.to_thread.run_sync(tree.make_parent, rel)
            await self._rpc.request("fs/write_text_file", {
                "sessionId": session.session_id, "path": os.path.join(session.cwd, rel),
                "content": text})
            after = await anyio.to_thread.run_sync(tree.state, rel)
            if after is not None:
                sync.files[rel] = after
            return
        sync.files[rel] = await anyio.to_thread.run_sync(tree.write, rel, data, info.mode)

    async def _cancel_run(self, session: _Session) -> None:
        run_id = session.run_id
        if run_id is None:
            record = await self.service.store.find_active_run(session.session_id)
            run_id = record.run_id if record is not None else None
        if run_id is not None:
            session.cancelled = True
            await self.service.cancel(run_id)

    async def _follow(self, session: _Session, run_id: str, after: int,
                      translator: UpdateTranslator) -> RunRecord | None:
        """Send the run's events after ``after`` as updates until its log closes, asking
        the editor about its approvals meanwhile; the run's final record."""
        service = self.service
        service.ensure_driving(run_id)  # a run left by a closed editor: drive it again
        await service.viewer_arrived(run_id)
        try:
            with anyio.CancelScope() as scope:
                session.follow = scope
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._permissions, session, run_id)
                    async for logged in service.store.read(run_id, after):
                        for update in translator.updates(logged.event):
                            await self._update(session.session_id, update)
                    tg.cancel_scope.cancel()
        finally:
            session.follow = None
            with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                await service.viewer_left(run_id)
        return await service.store.get(run_id)

    async def _permissions(self, session: _Session, run_id: str) -> None:
        async with anyio.create_task_group() as tg:
            while True:
                for pending in await list_pending(self.service.store, run_id):
                    if pending.approval_id not in session.asked:
                        session.asked.add(pending.approval_id)
                        tg.start_soon(self._ask, session, pending)
                await anyio.sleep(self.permission_poll)

    async def _ask(self, session: _Session, pending: Any) -> None:
        assert self._rpc is not None
        args = pending.args
        title = pending.tool
        if isinstance(args, dict):
            shown = args.get("input") if isinstance(args.get("input"), dict) else args
            command = shown.get("command") if isinstance(shown, dict) else None
            tool = args.get("tool_name")
            if isinstance(command, str):
                title = command
            elif isinstance(tool, str):
                title = tool
        tool_call: dict[str, Any] = {
            "toolCallId": pending.call_id or f"corral-approval-{pending.approval_id[:12]}",
            "title": title[:200], "status": "pending", "rawInput": args}
        try:
            answer = await self._rpc.request("session/request_permission", {
                "sessionId": session.session_id, "toolCall": tool_call,
                "options": [
                    {"optionId": ALLOW_OPTION, "name": "Allow", "kind": "allow_once"},
                    {"optionId": DENY_OPTION, "name": "Deny", "kind": "reject_once"},
                ]})
        except ConnectionGone:
            # The approval stays pending: the next connection's session/load asks again.
            session.asked.discard(pending.approval_id)
            return
        except RpcError as exc:
            log.warning("the editor did not answer permission request %s: %s",
                        pending.approval_id, exc.message)
            answer = None
        outcome = answer.get("outcome") if isinstance(answer, dict) else None
        allow = (isinstance(outcome, dict) and outcome.get("outcome") == "selected"
                 and outcome.get("optionId") == ALLOW_OPTION)
        try:
            await answer_approval(self.service.store, pending.run_id, pending.approval_id,
                                  allow, reason=None if allow else "refused in the editor")
        except ApprovalError as exc:  # answered elsewhere first (corral approve), expired
            log.info("approval %s: %s", pending.approval_id, exc)


KEPT: Final = ("changed in your editor since the agent's copy of it was made: your version "
                "was kept (the agent's is in the session's sandbox)")


def _utf8(data: bytes) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _cwd(params: dict[str, Any]) -> str:
    cwd = params.get("cwd")
    if not isinstance(cwd, str) or not os.path.isabs(cwd):
        raise RpcError(INVALID_PARAMS, "cwd must be an absolute path")
    if not os.path.isdir(cwd):
        raise RpcError(INVALID_PARAMS, f"cwd {cwd!r} is not a directory")
    return os.path.realpath(cwd)


def _prompt_text(blocks: Any) -> str:
    """The prompt's text: its text blocks, embedded text resources, and links by URI."""
    if not isinstance(blocks, list) or not blocks:
        raise RpcError(INVALID_PARAMS, "prompt must be a non-empty list of content blocks")
    parts: list[str] = []
    for block in blocks:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append(block["text"])
        elif kind == "resource_link" and isinstance(block.get("uri"), str):
            parts.append(f"[{block.get('name') or block['uri']}]({block['uri']})")
        elif kind == "resource" and isinstance(block.get("resource"), dict):
            res = block["resource"]
            if isinstance(res.get("text"), str):
                parts.append(f"<context uri={json.dumps(res.get('uri'))}>\n{res['text']}\n"
                             "</context>")
    text = "\n".join(parts)
    if not text.strip():
        raise RpcError(INVALID_PARAMS, "the prompt has no text")
    if len(text) > MAX_PROMPT:
        raise RpcError(INVALID_PARAMS, f"the prompt is longer than {MAX_PROMPT} characters")
    return text


def _stop_reason(record: RunRecord | None, cancelled: bool) -> str:
    if record is None:
        return "refusal"
    if record.status is RunStatus.COMPLETED:
        return "end_turn"
    if cancelled or record.status is RunStatus.ABORTED:
        return "cancelled"
    return "refusal"


_HANDLERS: Final[dict[str, Callable[[AcpAgent, dict[str, Any]], Awaitable[Any]]]] = {
    "initialize": AcpAgent.initialize,
    "session/new": AcpAgent.new_session,
    "session/load": AcpAgent.load_session,
    "session/resume": AcpAgent.resume_session,
    "session/close": AcpAgent.close_session,
    "session/prompt": AcpAgent.prompt,
    "session/cancel": AcpAgent.cancel,
}


async def serve_stdio(service: RunService, make_request: RequestFactory) -> None:
    """Speak ACP on this process's stdin/stdout (:func:`~corral.server._acp_rpc.stdio_lines`)
    until the editor closes stdin."""
    receive_line, send_line = stdio_lines()
    async with service.running():
        await AcpAgent(service, make_request).serve(receive_line, send_line)
