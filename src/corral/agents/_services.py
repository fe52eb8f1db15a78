"""A run's host services (model proxy, egress proxy) as a detached process.

The in-process :meth:`corral.agents._prepare.PreparedAgent.services` lives as long as the
driving host process. A detached run (the viewer left, nobody drives) still needs the model:
:func:`start_services` starts ``python -m corral.agents._services`` in its own session (double
fork, like the journal supervisor) and hands it the job — real key and the run's token
included — over an inherited pipe (never argv or environment); ``ready()`` waits until its sockets are bound. The daemon
serves until the run's supervisor records the agent's exit (``<token>.status.json``), then
exits; it also exits if no supervisor status appears within ``start_grace`` seconds, or on
SIGTERM. Usage is written after every request to ``<token>.usage.json`` next to the journal
(host-private).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from corral._telemetry import carrier, configure_from_env, context_of
from corral._errors import CorralError
from corral.journal._layout import JournalPaths
from corral.journal._supervisor import (
    child_env,
    file_tail,
    read_ready_report,
    report_ready,
    set_non_dumpable,
)
from corral.net._model_proxy import ModelProxy, Upstream, Usage
from corral.net._egress import EgressProxy
from corral.stores._protocols import SecretStore
from corral.tools._keys import corral_key, derive_token

__all__ = [
    "PROXY_TOKEN_NAME",
    "PendingServices",
    "ServicesProcess",
    "ServicesStartError",
    "launch_services",
    "main",
    "run_proxy_token",
    "services_job",
    "start_services",
]


PROXY_TOKEN_NAME = "CORRAL_PROXY_TOKEN"
"""The run's proxy token's name in its redactor."""


async def run_proxy_token(store: SecretStore, run_id: str) -> str:
    """Run ``run_id``'s proxy token (the API key its CLI sends the model proxy, the
    password of its egress proxy URL), derived from corral's key
    (:mod:`corral.tools._keys`): a driver that restarts the run's services on any host
    sharing the store serves with the token the agent already has, and the token is
    stored nowhere."""
    return derive_token(await corral_key(store), "corral-proxy-token", run_id)


def services_job(proxy: ModelProxy, model_socket: Path, egress: EgressProxy | None,
                 egress_socket: Path | None, status: Path) -> dict[str, Any]:
    """The daemon's job for a run's model ``proxy`` (and ``egress`` proxy) on these
    sockets, *without* the upstream key or the run's token (safe to record: a driver
    restarting a dead daemon adds them). The daemon stops when ``status``'s ``state``
    turns ``exited``."""
    up = proxy.upstream
    return {
        "upstream": {"api": up.api, "base_url": up.base_url,
                     "allowed_paths": list(up.allowed_paths)
                     if up.allowed_paths is not None else None},
        "budget": proxy.budget,
        "idle_timeout": proxy.idle_timeout,
        "max_failures": proxy.max_failures,
        "model_socket": str(model_socket),
        "egress": [r.source for r in egress.rules] if egress is not None else None,
        "egress_socket": str(egress_socket) if egress_socket else None,
        "status": str(status),
        # the run's trace (the start's span): the daemon's "chat" spans join it
        "trace": carrier(),
    }


async def launch_services(job: dict[str, Any], proxy: ModelProxy, token: str,
                          paths: JournalPaths) -> PendingServices:
    """Start the daemon for ``job`` (:func:`services_job`) beside the run's journal
    ``paths``, handing it the upstream key and the run's ``token`` over its pipe only."""
    full = {**job, "upstream": {**job["upstream"], "api_key": proxy.upstream.api_key},
            "token": token}
    paths.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    return await anyio.to_thread.run_sync(
        lambda: start_services(full, paths.directory, paths.token))


class ServicesStartError(CorralError):
    """The services daemon did not come up (the message carries its diagnostics)."""


@dataclass(frozen=True, slots=True)
class ServicesProcess:
    """A launched services daemon."""

    pid: int
    usage_path: Path
    log_path: Path

    def usage(self) -> Usage | None:
        """The usage the daemon last wrote (``None`` before the first request)."""

        return Usage.load(self.usage_path)


@dataclass
class PendingServices:
    """A daemon that was started and may still be binding its sockets."""

    proc: subprocess.Popen[bytes]
    ready_fd: int
    usage_path: Path
    log_path: Path

    def ready(self, timeout: float = 30.0) -> ServicesProcess:
        """Wait until the sockets are bound (raises :class:`ServicesStartError`)."""
        try:
            report = read_ready_report(self.ready_fd, timeout, "pid")
        finally:
            os.close(self.ready_fd)
            try:
                self.proc.wait(timeout=timeout)  # the intermediate exits after forking
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if report is None:
            raise ServicesStartError(f"the run's services did not start within {timeout}s: "
                                     f"{file_tail(self.log_path)}")
        return ServicesProcess(int(report["pid"]), self.usage_path, self.log_path)

    def abandon(self) -> None:
        """Stop the daemon when its agent never started (it would wait for a minute)."""
        try:
            services = self.ready(10.0)
        except CorralError:
            return
        with contextlib.suppress(OSError):
            os.kill(services.pid, signal.SIGTERM)


def start_services(job: dict[str, Any], private_dir: Path, token: str, *,
                   python: str = sys.executable) -> PendingServices:
    """Spawn the daemon for ``job`` and return at once; call ``ready()`` on the result.
    (The agent's forwarder waits for the sockets, so the agent may be launched meanwhile.)"""
    paths = JournalPaths(private_dir, token)
    usage_path, log_path = paths.usage, paths.services_log
    # The daemon's environment is fixed (child_env); OpenTelemetry's settings travel in the
    # job's pipe (OTEL_EXPORTER_OTLP_HEADERS may hold a credential: never recorded).
    otel = {k: v for k, v in os.environ.items() if k.startswith("OTEL_")}
    job = {**job, "usage": str(usage_path), "otel_env": otel}
    job_r, job_w = os.pipe()
    ready_r, ready_w = os.pipe()
    log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    env = child_env()
    try:
        proc = subprocess.Popen(
            [python, "-m", "corral.agents._services", "--job-fd", str(job_r), "--ready-fd",
             str(ready_w)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log_fd,
            pass_fds=(job_r, ready_w), close_fds=True, start_new_session=True, cwd="/",
            env=env,
        )
    except OSError:
        for fd in (job_r, job_w, ready_r, ready_w):
            os.close(fd)
        raise
    finally:
        os.close(log_fd)
    os.close(job_r)
    os.close(ready_w)
    try:
        with os.fdopen(job_w, "wb") as fh:
            fh.write(json.dumps(job).encode())
    except BrokenPipeError:
        pass  # it died at once: ready() reports its log
    return PendingServices(proc, ready_r, usage_path, log_path)


async def _serve(job: dict[str, Any], ready_fd: int) -> None:

    up = job["upstream"]
    paths = up.get("allowed_paths")
    token = job.get("token")
    if not isinstance(token, str) or not token:
        # without it the proxies would serve whoever reaches their sockets
        raise ServicesStartError("the services job carries no run token")
    proxy = ModelProxy(Upstream(up["api"], up["base_url"], up["api_key"],
                                tuple(paths) if paths is not None else None),
                       budget=job.get("budget"), idle_timeout=float(job["idle_timeout"]),
                       usage_path=job["usage"], max_failures=job.get("max_failures"),
                       token=token)
    previous = Usage.load(job["usage"])
    if previous is not None:  # restarted: go on counting where the predecessor stopped
        proxy.usage = previous
    otel = job.get("otel_env")
    if isinstance(otel, dict):
        os.environ.update({k: str(v) for k, v in otel.items() if str(k).startswith("OTEL_")})
    configure_from_env()  # this daemon exports its own spans (OTEL_* from the driver's env)
    trace = job.get("trace")
    proxy.trace_parent = context_of(trace if isinstance(trace, dict) else None)
    status = Path(job["status"])
    grace = float(job.get("start_grace", 60.0))
    stop = anyio.Event()

    async def watch() -> None:
        started = time.monotonic()
        while True:
            try:
                state = json.loads(status.read_text()).get("state")
            except (OSError, ValueError, AttributeError):
                state = None
                if time.monotonic() - started > grace:
                    break
            if state == "exited":
                await anyio.sleep(0.5)  # let the last response drain
                break
            await anyio.sleep(0.1)
        stop.set()

    async with anyio.create_task_group() as tg:
        await tg.start(proxy.serve, job["model_socket"])
        if job.get("egress_socket"):
            await tg.start(EgressProxy(list(job["egress"]), token=token).serve,
                           job["egress_socket"])
        report_ready(ready_fd, {"pid": os.getpid()})
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async def on_signal() -> None:
                async for _ in signals:
                    stop.set()
                    return

            tg.start_soon(on_signal)
            tg.start_soon(watch)
            await stop.wait()
            tg.cancel_scope.cancel()


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m corral.agents._services --job-fd N --ready-fd M``."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        job_fd = int(args[args.index("--job-fd") + 1])
        ready_fd = int(args[args.index("--ready-fd") + 1])
    except (ValueError, IndexError):
        print("usage: python -m corral.agents._services --job-fd N --ready-fd M", file=sys.stderr)
        return 2
    set_non_dumpable()  # the key stays private
    with os.fdopen(job_fd, "rb") as fh:
        job = json.loads(fh.read())
    if os.fork() > 0:
        os._exit(0)  # the launcher reaps the intermediate; the daemon is orphaned
    try:
        anyio.run(_serve, job, ready_fd)
    except BaseException as exc:  # noqa: BLE001 - last words go to the services log
        print(f"corral services failed: {exc!r}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
