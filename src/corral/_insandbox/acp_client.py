"""The ACP bridge: corral's Agent Client Protocol client, durable under the journal supervisor.

It runs on the **host**, as the journal supervisor's child (supervisor → this bridge →
the provider's host command → in-sandbox entry → the agent), so nothing the agent runs can
reach it, and it outlives the driving process like the supervisor does. It starts the agent
with its own stdin/stdout pipes (stderr inherited: the run's stderr sidecar) and speaks
newline-delimited JSON-RPC 2.0 with it:

``initialize`` (protocol version 1, no fs/terminal capabilities: the agent uses its own
tools inside the sandbox); when resuming the thread's session, ``session/resume`` (the
stable method: the agent reopens it without replaying its history) if the agent advertises
``sessionCapabilities.resume``, else (or if that fails) ``session/load`` if it reports
``agentCapabilities.loadSession``, else ``session/new`` (each fallback noted in the
journal; with ``on_session_lost: "fail"`` the bridge notes ``session-lost`` and ends the
run instead of starting a new conversation); ``session/set_mode`` when the profile names a mode; one ``session/prompt``; then
``session/close`` when the agent advertises ``sessionCapabilities.close``.

Every message in both directions is written to stdout — the run's journal — as one JSON
line (``{"acp": "send"|"recv", "msg": {...}}``), and the bridge's own notes as ``{"acp":
"note", ...}``, so the host-side translator (:mod:`corral.harness._acp`) rebuilds the run
from the journal alone: the journal *is* the protocol state, not this process's memory.

Agent → client requests: ``session/request_permission`` is decided by corral's policy, asked
of the run's ``corral`` MCP server (tool ``permission_prompt``, as the command gate does)
over the host-side unix socket of the run's tool server. Its path derives from the run id,
so whichever driver serves it now (a dead driver's successor) answers; while nobody serves,
the bridge retries, up to ``patience`` seconds, then rejects. The answer selects the
agent's ``allow_once`` / ``reject_once`` option by kind (never by name); anything going
wrong rejects (fails closed). Every other request (``fs/*``, ``terminal/*``, unknown)
gets JSON-RPC error -32601. The agent's output is hostile: malformed or oversized lines are
noted, never fatal.

SIGTERM/SIGINT: ``session/cancel``, then the agent is stopped after a grace period; the
bridge then dies of the same signal (what the supervisor records for any cancelled agent).

Its configuration comes on stdin, never argv/env: a decimal byte count, a newline, then that
many bytes of JSON (the inner command's argv/env/cwd and its ``stdin_prefix`` (base64) —
bubblewrap's launcher reads env/argv from stdin first —, the prompt, the session's ``cwd``
and ``mcpServers``, ``resume``, ``on_session_lost``, ``mode``, ``session_params`` (more
``session/new`` / ``session/load`` parameters, e.g. Claude's ``_meta``), ``command_in_title``,
``secrets``
(``${VAR}`` values filled in on the wire only, never in the journal), ``await_ports``, and
``permission``: ``{"socket", "token", "path", "patience"}`` or ``null`` for allow-all).

Why not the ``agent-client-protocol`` Python SDK (0.12.1): this side must be stdlib-only
(it runs under the supervisor with ``python3 -I -S``, possibly a bare system Python; the
SDK needs pydantic; ``python -X importtime -c "import acp"`` measured 1.15 s here, against
~30 ms of imports for this module), and
the SDK's connection keeps the protocol state (pending requests, session) in one process's
memory, whereas here the journal is the state a successor host rebuilds everything from.

Python ≥ 3.8, no corral import.
"""

from __future__ import annotations

# Only what starting the agent needs is imported here (re, shlex, socket, base64 and typing
# cost ~30 ms of a fresh interpreter before the agent could start; they load when used).
import binascii
import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

PROTOCOL_VERSION = 1
MAX_LINE = 64 << 20
"""Bytes of one agent line the bridge accepts; longer ones are noted and dropped."""
MAX_HEADER = 16 << 20
CANCEL_GRACE = 3.0
"""Seconds between ``session/cancel`` and stopping the agent (the supervisor's own timeout
grace, 5 s, is longer: it must not SIGKILL this bridge first)."""
EXIT_GRACE = 2.0
"""Seconds the agent gets to exit by itself once its prompt is answered and stdin closed."""
INIT_TIMEOUT = 120.0
CLOSE_GRACE = 2.0
"""Seconds the agent gets to answer ``session/close`` before it is stopped anyway."""
LOAD_QUIET = 0.3
LOAD_SETTLE = 5.0
"""After ``session/load``: the prompt waits for this long a silence (at most
:data:`LOAD_SETTLE` s) while the agent replays the session's history."""
NOT_FOUND = -32601
_PR_SET_DUMPABLE = 4
_PR_SET_PDEATHSIG = 1




def set_non_dumpable() -> None:
    """Other processes of this uid cannot read this one's memory (the tools token)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def read_header(stream: Any) -> dict[str, Any]:
    """The length-prefixed JSON configuration from ``stream`` (a binary file)."""
    line = stream.readline(32)
    size = int(line.strip() or b"-1")
    if not 0 < size <= MAX_HEADER:
        raise ValueError("bad configuration header")
    data = b""
    while len(data) < size:
        chunk = stream.read(size - len(data))
        if not chunk:
            raise ValueError("truncated configuration header")
        data += chunk
    config = json.loads(data)
    if not isinstance(config, dict):
        raise ValueError("the configuration is not a JSON object")
    return config


def encode_header(config: dict[str, Any]) -> bytes:
    """The bytes :func:`read_header` reads (for the host that launches the bridge)."""
    body = json.dumps(config, separators=(",", ":")).encode()
    return str(len(body)).encode() + b"\n" + body


# ---------------------------------------------------------------- policy


HOST_TOOL = (r"^(?:corral_|mcp__corral__|mcp_corral_)[A-Za-z0-9_.-]+$|"
             r"^[A-Za-z0-9_.-]+ \(corral MCP Server\)$")
"""How agents name a tool of the run's ``corral`` MCP server (opencode ``corral_x``, Claude
``mcp__corral__x``, gemini ``mcp_corral_x`` / title ``x (corral MCP Server)``): a regular
expression."""


def is_host_tool(tc: dict[str, Any]) -> bool:
    """Whether an ``other``-kind call is one of corral's host tools (they decide their own
    approvals on the host; the policy's command rules are not about them)."""
    meta = tc.get("_meta") if isinstance(tc.get("_meta"), dict) else {}
    claude = meta.get("claudeCode") if isinstance(meta, dict) else None
    names = [tc.get("title"), tc.get("name"),
             claude.get("toolName") if isinstance(claude, dict) else None]
    import re  # cached after the first call

    return any(isinstance(n, str) and re.match(HOST_TOOL, n) for n in names)


def permission_question(tool_call: Any, command_in_title: bool = False
                        ) -> tuple[str, dict[str, Any]] | None:
    """``(tool_name, input)`` for corral's permission prompt from an ACP ``toolCall``, or
    ``None`` for tools that only read and corral's own host tools (allowed without asking).
    Never takes a tool name from the agent: its ``kind`` picks the question.
    ``command_in_title``: the agent reports a command only as the call's title (gemini)."""
    tc: dict[str, Any] = tool_call if isinstance(tool_call, dict) else {}
    kind = tc.get("kind")
    raw: dict[str, Any] = tc["rawInput"] if isinstance(tc.get("rawInput"), dict) else {}
    if kind == "execute":
        command = raw.get("command")
        if command is None and command_in_title:
            command = tc.get("title")
        if isinstance(command, list) and all(isinstance(a, str) for a in command):
            import shlex

            command = " ".join(shlex.quote(a) for a in command) if len(command) > 1 \
                else (command[0] if command else None)
        return "Bash", {"command": command if isinstance(command, str) else None}
    if kind in ("edit", "delete", "move"):
        paths = [loc.get("path") for loc in tc.get("locations") or []
                 if isinstance(loc, dict) and isinstance(loc.get("path"), str)]
        return "Edit", {"kind": kind, "paths": paths}
    if kind == "fetch":
        url = raw.get("url")
        return "WebFetch", {"url": url if isinstance(url, str) else None}
    if kind in ("read", "search", "think") or (kind == "other" and is_host_tool(tc)):
        return None
    # Not a name the agent chose: an unknown tool takes the policy's default.
    return "acp_other", {"kind": kind if isinstance(kind, str) else None}


def pick_option(options: Any, allow: bool) -> str | None:
    """The optionId to select: ``allow_once`` to allow; ``reject_once`` (else
    ``reject_always``) to refuse. ``None``: no such option (refuse by cancelling)."""
    wanted = ("allow_once",) if allow else ("reject_once", "reject_always")
    for kind in wanted:
        for opt in options if isinstance(options, list) else []:
            if isinstance(opt, dict) and opt.get("kind") == kind \
                    and isinstance(opt.get("optionId"), str):
                return str(opt["optionId"])
    return None


def _http_unix(sock_path: str, path: str, body: bytes, token: str,
               timeout: float | None) -> bytes:
    head = (f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Accept: application/json, text/event-stream\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    import socket

    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(timeout)
    try:
        conn.connect(sock_path)
        conn.sendall(head.encode() + body)
        chunks = []
        while True:
            data = conn.recv(65536)
            if not data:
                break
            chunks.append(data)
    finally:
        conn.close()
    return _http_body(b"".join(chunks))


def _http_body(raw: bytes) -> bytes:
    header, sep, payload = raw.partition(b"\r\n\r\n")
    if not sep:
        raise ConnectionError("truncated answer")
    lines = header.decode("latin-1").split("\r\n")
    status = lines[0].split(" ", 2)
    if len(status) < 2 or status[1] != "200":
        if status[1:2] and status[1].startswith("5"):
            # the driver failed or stopped mid-answer (its handler was cancelled): as
            # retryable as no driver at all, a successor answers
            raise ConnectionError(f"the run's MCP server answered {lines[0][:100]!r}")
        raise RuntimeError(f"the run's MCP server answered {lines[0][:100]!r}")
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        out = b""
        while True:
            size_line, sep, payload = payload.partition(b"\r\n")
            if not sep:
                raise ConnectionError("truncated chunked answer")
            size = int(size_line.split(b";")[0], 16)
            if size == 0:
                return out
            out += payload[:size]
            payload = payload[size + 2:]
    if "content-length" in headers:
        length = int(headers["content-length"])
        if len(payload) < length:
            raise ConnectionError("truncated answer")
        return payload[:length]
    return payload


def ask_corral(permission: dict[str, Any], tool_name: str, tool_input: dict[str, Any], call_id: str | None
               ) -> tuple[bool, str]:
    """``(allowed, why)`` from the run's ``permission_prompt`` tool. Retries while no
    driver serves the socket (a successor will), up to ``permission["patience"]`` s."""
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "permission_prompt", "arguments": {
            "tool_name": tool_name, "input": tool_input, "tool_use_id": call_id}}}).encode()
    deadline = time.monotonic() + float(permission.get("patience") or 3600)
    delay = 0.05
    while True:
        try:
            raw = _http_unix(str(permission["socket"]), str(permission.get("path") or "/mcp"),
                             body, str(permission["token"]), timeout=None)
            break
        except (OSError, ConnectionError) as exc:
            # no driver serves now, or the one that did died mid-answer: a successor asks
            if time.monotonic() + delay > deadline:
                return False, "corral could not check this against the sandbox policy " \
                              f"({exc.__class__.__name__}); it was refused"
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
        except RuntimeError as exc:  # refused by the server (e.g. a bad token): final
            return False, f"corral's permission check failed ({exc}); the call was refused"
    try:
        answer = json.loads(_sse_or_json(raw))
        result = answer["result"]
        text = "".join(c.get("text", "") for c in result.get("content", []))
        if result.get("isError"):
            return False, text or "the permission check failed"
        verdict = json.loads(text)
        if verdict.get("behavior") == "allow":
            return True, "allowed by corral policy"
        return False, str(verdict.get("message") or "denied by corral policy")
    except Exception as exc:  # noqa: BLE001 - a malformed answer refuses
        return False, f"malformed answer from the permission check ({exc.__class__.__name__})"


def _sse_or_json(raw: bytes) -> bytes:
    text = raw.strip()
    if text.startswith(b"{"):
        return text
    data = [line[5:].strip() for line in text.splitlines() if line.startswith(b"data:")]
    return data[-1] if data else text


def wait_exit(proc: Any, timeout: float) -> int | None:
    """``proc``'s return code, or ``None`` while it still runs after ``timeout`` seconds.
    Woken by the exit itself (a pidfd, Linux ≥ 5.3, Python ≥ 3.9): ``Popen.wait(timeout)``
    polls with sleeps growing to 50 ms, which the end of every run waited through."""
    try:
        fd = os.pidfd_open(proc.pid)  # type: ignore[attr-defined,unused-ignore]
    except (AttributeError, OSError):
        try:
            return int(proc.wait(timeout))
        except subprocess.TimeoutExpired:
            return None
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        if poller.poll(max(0.0, timeout) * 1000):
            return int(proc.wait())
        return proc.poll()  # type: ignore[no-any-return]
    finally:
        os.close(fd)


# ---------------------------------------------------------------- the bridge


class Bridge:
    """One agent process and one prompt (see the module docstring)."""

    def __init__(self, config: dict[str, Any], out: Any) -> None:
        self.config = config
        self.out = out
        self.out_lock = threading.Lock()
        self.in_lock = threading.Lock()
        self.next_id = 0
        self.pending: dict[int, list[Any]] = {}
        self.pending_lock = threading.Lock()
        self.cancel_event = threading.Event()
        self.agent_gone = threading.Event()
        self.proc: subprocess.Popen | None = None  # type: ignore[type-arg]
        self.session_id: str | None = None
        self.can_close = False
        self.closed = False
        self.max_line = int(config.get("max_line") or MAX_LINE)
        self.ports: dict[str, int] = {}
        self.ports_known = threading.Event()
        self.last_recv = time.monotonic()

    # -- journal
    def journal(self, obj: dict[str, Any]) -> None:
        line = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8",
                                                                                "replace")
        with self.out_lock:
            try:
                self.out.write(line + b"\n")
                self.out.flush()
            except (OSError, ValueError):
                pass

    def note(self, event: str, **fields: Any) -> None:
        self.journal({"acp": "note", "event": event, **fields})

    # -- wire
    def send(self, msg: dict[str, Any], wire: dict[str, Any] | None = None) -> None:
        """Journal ``msg``, write ``wire`` (default: the same) to the agent. A ``wire``
        copy carries what the journal must not (the tools token in ``mcpServers``)."""
        self.journal({"acp": "send", "msg": msg})
        data = json.dumps(wire if wire is not None else msg,
                          separators=(",", ":")).encode() + b"\n"
        proc = self.proc
        with self.in_lock:
            try:
                assert proc is not None and proc.stdin is not None
                proc.stdin.write(data)
                proc.stdin.flush()
            except (OSError, ValueError, AssertionError):
                pass  # the agent is gone; the reader notices

    def request(self, method: str, params: dict[str, Any], timeout: float | None = None,
                wire_params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send a request and wait for its response (``{"error": ...}`` when the agent
        exits or the wait times out first)."""
        with self.pending_lock:
            self.next_id += 1
            rid = self.next_id
            slot: list[Any] = [threading.Event(), None]
            self.pending[rid] = slot
        msg = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
        wire = None if wire_params is None else dict(msg, params=wire_params)
        self.send(msg, wire)
        deadline = None if timeout is None else time.monotonic() + timeout
        while not slot[0].wait(0.1):
            if self.agent_gone.is_set():
                return {"error": {"code": -32000, "message": "the agent exited"}}
            if deadline is not None and time.monotonic() > deadline:
                return {"error": {"code": -32000, "message": "no answer in time"}}
        return slot[1] if isinstance(slot[1], dict) else {}

    def reader(self) -> None:
        proc = self.proc
        assert proc is not None and proc.stdout is not None
        stream = proc.stdout
        if self.config.get("await_ports"):
            # the entry's first line: the ports it bound in the sandbox (before the agent
            # starts, so the agent cannot forge it)
            first = stream.readline(65536)
            try:
                ports = json.loads(first)["corral.ports"]
                self.ports = {str(k): int(v) for k, v in ports.items()}
                self.note("ports", ports=self.ports)
            except (ValueError, KeyError, TypeError, AttributeError):
                if first:
                    self.on_line(first)
        self.ports_known.set()
        while True:
            line = stream.readline(self.max_line + 1)
            if not line:
                break
            if len(line) > self.max_line and not line.endswith(b"\n"):
                skipped = len(line)
                while True:  # drop the rest of the oversized line
                    more = stream.readline(self.max_line)
                    skipped += len(more)
                    if not more or more.endswith(b"\n"):
                        break
                self.note("oversized-line", bytes=skipped)
                continue
            self.on_line(line)
        self.agent_gone.set()

    def on_line(self, line: bytes) -> None:
        self.last_recv = time.monotonic()
        text = line.decode("utf-8", "replace").strip()
        if not text:
            return
        try:
            msg = json.loads(text)
        except ValueError:
            msg = None
        if not isinstance(msg, dict):
            self.note("not-json-rpc", line=text[:4000])
            return
        self.journal({"acp": "recv", "msg": msg})
        method = msg.get("method")
        mid = msg.get("id")
        if isinstance(method, str):
            if "id" in msg:  # a request: answered off this thread (it may wait for a human)
                threading.Thread(target=self.answer, args=(mid, method, msg.get("params")),
                                 daemon=True).start()
            return
        if isinstance(mid, int) and not isinstance(mid, bool):
            with self.pending_lock:
                slot = self.pending.pop(mid, None)
            if slot is not None:
                slot[1] = msg
                slot[0].set()

    def answer(self, mid: Any, method: str, params: Any) -> None:
        if method == "session/request_permission" and isinstance(params, dict):
            try:
                result = self.permission(params)
            except Exception as exc:  # noqa: BLE001 - unanswered, the agent would wait forever
                self.note("permission", allowed=False,
                          reason=f"the permission check failed ({exc.__class__.__name__}: "
                                 f"{str(exc)[:200]})")
                result = {"outcome": {"outcome": "cancelled"}}
            self.send({"jsonrpc": "2.0", "id": mid, "result": result})
            return
        self.send({"jsonrpc": "2.0", "id": mid, "error": {
            "code": NOT_FOUND, "message": "corral's ACP client does not offer " + method[:200]}})

    def permission(self, params: dict[str, Any]) -> dict[str, Any]:
        if self.cancel_event.is_set():
            return {"outcome": {"outcome": "cancelled"}}
        tool_call = params.get("toolCall")
        question = permission_question(tool_call, bool(self.config.get("command_in_title")))
        policy = self.config.get("permission")
        if question is None:
            allowed, why = True, "reads only"
        elif not isinstance(policy, dict):
            allowed, why = True, "no sandbox policy: the sandbox is the boundary"
        else:
            call = tool_call.get("toolCallId") if isinstance(tool_call, dict) else None
            allowed, why = ask_corral(policy, question[0], question[1],
                                      call if isinstance(call, str) else None)
        option = pick_option(params.get("options"), allowed)
        self.note("permission", toolCallId=tool_call.get("toolCallId")
                  if isinstance(tool_call, dict) else None, allowed=allowed, reason=why,
                  optionId=option)
        if option is None or self.cancel_event.is_set():
            return {"outcome": {"outcome": "cancelled"}}
        return {"outcome": {"outcome": "selected", "optionId": option}}

    # -- life cycle
    def start(self) -> None:
        cfg = self.config

        def child_setup() -> None:
            # the agent dies with this bridge (bubblewrap's launcher also has
            # --die-with-parent; a local agent has only this)
            try:
                ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            except (OSError, AttributeError):
                pass

        self.proc = subprocess.Popen(
            list(cfg["argv"]), env=dict(cfg.get("env") or {}), cwd=cfg.get("cwd"),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True,
            start_new_session=True, preexec_fn=child_setup)
        prefix = binascii.a2b_base64(cfg.get("stdin_prefix") or "")
        if prefix:
            assert self.proc.stdin is not None
            self.proc.stdin.write(prefix)
            self.proc.stdin.flush()
        threading.Thread(target=self.reader, daemon=True).start()

    def substitute(self, value: Any, secrets: dict[str, str]) -> Any:
        """``value`` with ``{corral.port.NAME}`` and ``${VAR}`` (``secrets`` only) filled."""
        if isinstance(value, str):
            for name, port in self.ports.items():
                value = value.replace("{corral.port." + name + "}", str(port))
            for var, secret in secrets.items():
                value = value.replace("${" + var + "}", str(secret))
            return value
        if isinstance(value, list):
            return [self.substitute(v, secrets) for v in value]
        if isinstance(value, dict):
            return {k: self.substitute(v, secrets) for k, v in value.items()}
        return value

    def run(self) -> int:
        cfg = self.config
        if not self.ports_known.wait(INIT_TIMEOUT):
            self.note("no-ports")
            return 1
        init = self.request("initialize", {
            "protocolVersion": PROTOCOL_VERSION,
            "clientCapabilities": {"fs": {"readTextFile": False, "writeTextFile": False},
                                   "terminal": False},
            "clientInfo": {"name": "corral", "version": str(cfg.get("version") or "")},
        }, timeout=INIT_TIMEOUT)
        if "error" in init or self.cancel_event.is_set():
            return 1
        caps = (init.get("result") or {}).get("agentCapabilities") or {}
        if not isinstance(caps, dict):
            caps = {}
        sessions = caps.get("sessionCapabilities")
        self.can_close = isinstance(sessions, dict) and isinstance(sessions.get("close"), dict)
        cwd = str(cfg.get("workdir") or "/workspace")
        secrets = dict(cfg.get("secrets") or {})
        extra = self.substitute(dict(cfg.get("session_params") or {}), {})
        servers = self.substitute(list(cfg.get("mcp_servers") or []), {})
        wire_extra = self.substitute(extra, secrets)
        wire_servers = self.substitute(servers, secrets)
        resume = cfg.get("resume")
        session: str | None = None
        if isinstance(resume, str) and resume:
            session = self.reopen(resume, caps, cwd, extra, servers, wire_extra, wire_servers)
            if session is None and cfg.get("on_session_lost") == "fail":
                # the conversation would start over: the run asked to fail instead
                self.note("session-lost", sessionId=resume)
                return 1
        if session is None:
            made = self.request("session/new", {**extra, "cwd": cwd, "mcpServers": servers},
                                wire_params={**wire_extra, "cwd": cwd,
                                             "mcpServers": wire_servers})
            result = made.get("result") if isinstance(made.get("result"), dict) else {}
            sid = result.get("sessionId") if isinstance(result, dict) else None
            if not isinstance(sid, str):
                return 1
            session = sid
        self.session_id = session
        mode = cfg.get("mode")
        if isinstance(mode, str) and mode and not self.cancel_event.is_set():
            set_mode = self.request("session/set_mode", {"sessionId": session,
                                                         "modeId": mode})
            if "error" in set_mode:
                # the policy depends on this mode: never prompt without it
                self.note("mode-refused", modeId=mode)
                return 1
        if self.cancel_event.is_set():
            return 1
        done = self.request("session/prompt", {"sessionId": session, "prompt": [
            {"type": "text", "text": str(cfg.get("prompt") or "")}]})
        self.close_session()
        return 0 if "result" in done else 1

    def reopen(self, resume: str, caps: dict[str, Any], cwd: str, extra: dict[str, Any],
               servers: list[Any], wire_extra: dict[str, Any], wire_servers: list[Any]
               ) -> str | None:
        """Reopen the thread's session ``resume``: ``session/resume`` (no history replayed)
        when the agent advertises ``sessionCapabilities.resume``, else (or when it fails)
        ``session/load``; ``None`` when neither reopened it (a new session is made)."""
        sessions = caps.get("sessionCapabilities")
        params = {**extra, "sessionId": resume, "cwd": cwd, "mcpServers": servers}
        wire = {**wire_extra, "sessionId": resume, "cwd": cwd, "mcpServers": wire_servers}
        if isinstance(sessions, dict) and isinstance(sessions.get("resume"), dict):
            resumed = self.request("session/resume", params, wire_params=wire)
            if "error" not in resumed:
                return resume
            self.note("resume-failed", sessionId=resume)
        if caps.get("loadSession") is not True:
            self.note("no-load-session", sessionId=resume)
            return None
        loaded = self.request("session/load", params, wire_params=wire)
        if "error" in loaded:
            self.note("load-failed", sessionId=resume)
            return None
        self.settle()
        return resume

    def close_session(self) -> None:
        """``session/close`` once the prompt is over, when the agent advertises
        ``sessionCapabilities.close`` (it frees the session and ends its work before the
        agent is stopped); waited for at most :data:`CLOSE_GRACE` s."""
        session = self.session_id
        if session is None or not self.can_close or self.closed or self.agent_gone.is_set():
            return
        self.closed = True
        self.request("session/close", {"sessionId": session}, timeout=CLOSE_GRACE)

    def settle(self) -> None:
        """Wait until the agent has been quiet for ``LOAD_QUIET`` s (at most
        ``LOAD_SETTLE`` s): some agents (gemini) go on replaying a loaded session's history
        after the load result, and a prompt sent meanwhile would mix the two."""
        deadline = time.monotonic() + LOAD_SETTLE
        while time.monotonic() < deadline and not self.agent_gone.is_set() \
                and time.monotonic() - self.last_recv < LOAD_QUIET:
            time.sleep(0.02)

    def cancel(self) -> None:
        """``session/cancel`` (once), then the agent is stopped after the grace."""
        if self.cancel_event.is_set():
            return
        self.cancel_event.set()
        if self.session_id is not None:
            self.send({"jsonrpc": "2.0", "method": "session/cancel",
                       "params": {"sessionId": self.session_id}})

    def stop(self, grace: float) -> None:
        proc = self.proc
        if proc is None:
            return
        with self.in_lock:
            try:
                assert proc.stdin is not None
                proc.stdin.close()
            except (OSError, AssertionError):
                pass
        wait_exit(proc, grace)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except OSError:
                pass
            if wait_exit(proc, 1.0) is not None:
                break
        self.agent_gone.wait(2.0)  # the reader journals what the agent wrote last


def main() -> int:
    set_non_dumpable()
    stdin = sys.stdin.buffer
    try:
        config = read_header(stdin)
    except (ValueError, OSError) as exc:
        sys.stderr.write(f"corral acp bridge: {exc}\n")
        return 2
    out = sys.stdout.buffer
    bridge = Bridge(config, out)
    got: list[int] = []
    wake = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        got.append(signum)
        wake.set()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    try:
        bridge.start()
    except OSError as exc:
        sys.stderr.write("corral: cannot start {}: {}\n".format(config.get("argv"), exc))
        return 127 if isinstance(exc, FileNotFoundError) else 126
    result: list[int] = []

    def drive() -> None:
        try:
            result.append(bridge.run())
        except Exception as exc:  # noqa: BLE001 - noted; the run ends as failed
            bridge.note("bridge-error", error=f"{exc.__class__.__name__}: {exc}")
            result.append(1)
        wake.set()

    threading.Thread(target=drive, daemon=True).start()
    while not wake.wait(0.2):
        pass
    if got:
        bridge.cancel()
        deadline = time.monotonic() + CANCEL_GRACE
        while not result and time.monotonic() < deadline:
            time.sleep(0.05)
        bridge.stop(0.0)
        bridge.note("cancelled", signal=got[0])
        try:
            out.flush()
        except (OSError, ValueError):
            pass
        signal.signal(got[0], signal.SIG_DFL)
        os.kill(os.getpid(), got[0])
        return 128 + got[0]
    bridge.stop(EXIT_GRACE)
    return result[0] if result else 1


if __name__ == "__main__":
    code = main()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    # Without the interpreter's teardown (its threads and modules: ~10-15 ms here), which
    # the run's end would wait for: the journal is flushed line by line already.
    os._exit(code)
