"""Another local user attacks a live docker run's sockets (issue #25, defect 2; the
bubblewrap cases and the reasoning are in ``test_local_users.py``).

On docker the agent is uid/gid 1000 in the container and, without user-namespace
remapping, on the host too: the run's sockets open to that gid only. A host user who
happens to be uid/gid 1000 reaches them, so the run's token is what stops that user; any
other user cannot even connect."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator

import anyio
import pytest

from corral.net._model_proxy import PLACEHOLDER_KEY
from corral.providers._docker import DockerProvider
from corral.testing._model_server import ModelServer

from .local_users import (
    NOBODY,
    as_user,
    connect_request,
    from_sandbox,
    live_run,
    model_request,
    refused,
    tool_calls,
    tools_request,
)

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.usefixtures("need_docker", "agents_env"),
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root (setpriv)")]


@pytest.fixture
def docker_provider() -> Iterator[DockerProvider]:
    yield DockerProvider()


def test_other_users_get_nothing_from_a_docker_runs_sockets(
        docker_provider: DockerProvider, model_server: ModelServer) -> None:
    async def go() -> None:
        async with live_run(docker_provider, model_server) as run:
            prepared = run.prepared
            assert prepared.egress_socket is not None and prepared.host_tools is not None
            target = f"127.0.0.1:{run.tcp_port}"
            attacks = [(prepared.model_socket, model_request(PLACEHOLDER_KEY), 401),
                       (prepared.egress_socket, connect_request(target, None), 407),
                       (prepared.host_tools.socket, tools_request("guessed-token-0123456"),
                        401)]
            for sock, request, status in attacks:
                # any user but the container's cannot connect
                attack = await as_user(NOBODY, sock, request)
                assert attack.get("errno") == errno.EACCES, (sock, attack)
                # the host user with the container's uid connects, and is refused
                attack = await as_user(docker_provider.uid, sock, request)
                assert refused(attack, status) and "status" in attack, (sock, attack)
            assert model_server.requests == []
            assert (prepared.model_proxy.usage.requests, prepared.model_proxy.usage.total) == (
                0, 0)
            assert run.tcp_accepted == [] and tool_calls == []
            # the container itself gets through, with its run's token
            ok = await from_sandbox(run.handle, run.inside(prepared.model_socket),
                                    model_request(prepared.proxy_token))
            assert ok["status"] == 200, ok
            ok = await from_sandbox(run.handle, run.inside(prepared.egress_socket),
                                    connect_request(target, prepared.proxy_token))
            assert ok["status"] == 200, ok
            ok = await from_sandbox(run.handle, run.inside(prepared.host_tools.socket),
                                    tools_request(prepared.host_tools.token))
            assert ok["status"] not in (401, 403), ok

    anyio.run(go)
