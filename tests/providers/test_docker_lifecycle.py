"""The docker provider's lifecycle beyond the kit: orphans found by label and collected by
``corral gc``; what a sandbox's container and volumes look like (labels, isolation
settings, no spec secrets); destroy removes the volumes too."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from corral.providers._docker import DockerProvider, container_name, volume_names
from corral.sandbox._contracts import SandboxSpec
from corral.sandbox._ensure import store_id
from corral.stores import open_store
from corral.stores._protocols import InstanceRecord

pytestmark = pytest.mark.usefixtures("corral_home", "need_docker")


def _exists(name: str) -> bool:
    api = DockerProvider().api
    return bool(api.containers(all=True, filters={"name": f"^/{name}$"}))


@pytest.mark.anyio
async def test_gc_collects_orphans_of_its_store_only(
    tmp_path: Path, corral_cmd: list[str], cli_env: dict[str, str]
) -> None:
    url = f"sqlite://{tmp_path / 'corral.db'}"
    store = await open_store(url)
    provider = DockerProvider()
    made = []
    try:
        ours = await store_id(store)
        assert ours
        labels = {"corral.store": ours}
        # an orphan: made for a key of this store, no record points to it
        orphan = await provider.create(SandboxSpec(labels={**labels, "corral.key": "k-orphan"}))
        # recorded: the instance record points to it
        kept = await provider.create(SandboxSpec(labels={**labels, "corral.key": "k-kept"}))
        await store.upsert_instance(InstanceRecord("k-kept", "docker", kept.id, "t",
                                                   time.time()))
        # a record of the key names another sandbox: this one is an orphan too
        stale = await provider.create(SandboxSpec(labels={**labels, "corral.key": "k-kept2"}))
        await store.upsert_instance(InstanceRecord("k-kept2", "docker", "sb-other", "t",
                                                   time.time()))
        # another store's sandbox, and one made without a key (corral exec --keep)
        other = await provider.create(SandboxSpec(labels={"corral.store": "0" * 16,
                                                          "corral.key": "k-orphan"}))
        keyless = await provider.create(SandboxSpec(labels={"corral.store": ours}))
        made = [orphan, kept, stale, other, keyless]

        def gc(*extra: str) -> list[dict[str, str]]:
            r = subprocess.run([*corral_cmd, "gc", "--store", url, "--json", *extra],
                               env=cli_env, capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, r.stderr
            entries: list[dict[str, str]] = json.loads(r.stdout)["entries"]  # one document
            return entries

        # young orphans are left alone (one may be being made right now)
        assert [e for e in gc() if e["outcome"].startswith("orphan")] == []
        dry = gc("--orphan-grace", "0", "--dry-run")
        assert sorted(e["sandbox"] for e in dry) == sorted([orphan.id, stale.id])
        assert all(e["outcome"] == "orphan-would-destroy" for e in dry)
        done = gc("--orphan-grace", "0")
        assert sorted((e["sandbox"], e["outcome"]) for e in done) == sorted(
            [(orphan.id, "orphan-destroyed"), (stale.id, "orphan-destroyed")])
        for h in (orphan, stale):
            assert not _exists(container_name(h.id))
            vols = {v["Name"] for v in provider.api.volumes()["Volumes"] or []}
            assert not set(volume_names(h.id).values()) & vols
        for h in (kept, other, keyless):
            assert _exists(container_name(h.id))
    finally:
        for h in made:
            await provider.destroy(h.ref)
        await store.aclose()


@pytest.mark.anyio
async def test_container_is_locked_down_and_labelled() -> None:
    provider = DockerProvider()
    h = await provider.create(SandboxSpec(env={"PLAIN": "yes"},
                                          labels={"corral.run": "run-1", "corral.key": "k"}))
    try:
        info = provider.api.inspect_container(container_name(h.id))
        labels = info["Config"]["Labels"]
        assert {k: labels[k] for k in ("corral", "corral.sandbox", "corral.run",
                                       "corral.key", "corral.created-by")} == {
            "corral": "1", "corral.sandbox": h.id, "corral.run": "run-1", "corral.key": "k",
            "corral.created-by": "corral"}
        hc = info["HostConfig"]
        assert hc["ReadonlyRootfs"] is True and hc["NetworkMode"] == "none"
        assert hc["CapDrop"] == ["ALL"] and "no-new-privileges" in hc["SecurityOpt"]
        assert hc["PidsLimit"] and hc["Memory"]
        assert info["Config"]["User"] in ("", "root", "0")  # pid 1; commands run as the agent
        who = await h.process.exec(["id", "-u"])
        assert who.stdout == b"1000\n"
        # volumes carry the labels too, so they are found and removed with the sandbox
        for name in volume_names(h.id).values():
            vol = provider.api.inspect_volume(name)
            assert vol["Labels"]["corral.sandbox"] == h.id
    finally:
        await provider.destroy(h.ref)
    vols = {v["Name"] for v in provider.api.volumes()["Volumes"] or []}
    assert not set(volume_names(h.id).values()) & vols
    assert not _exists(container_name(h.id))


@pytest.mark.anyio
async def test_an_env_given_per_exec_is_in_no_container_or_exec_config() -> None:
    provider = DockerProvider()
    h = await provider.create()
    secret = "s3cr3t-" + "x" * 12
    try:
        p = await h.process.spawn(["sh", "-c", 'echo "$TOKEN"; sleep 30'], env={"TOKEN": secret})
        it = p.stdout.__aiter__()
        assert (await it.__anext__()).strip() == secret.encode()
        info = provider.api.inspect_container(container_name(h.id))
        assert secret not in json.dumps(info)
        for exec_id in info.get("ExecIDs") or []:
            assert secret not in json.dumps(provider.api.exec_inspect(exec_id))
        await p.kill()
        await p.wait()
        await p.aclose()
    finally:
        await provider.destroy(h.ref)


@pytest.mark.anyio
async def test_snapshot_is_a_commit_without_secrets_and_restores() -> None:
    from corral.providers._snapshots import SecretInSnapshotError
    from corral.sandbox._redact import Redactor

    provider = DockerProvider()
    secret = "tok-" + "9f3a" * 8
    snaps = provider.snapshotter(redactor=Redactor({"API_TOKEN": secret}))
    h = await provider.create(SandboxSpec(env={"PLAIN": "spec-env"}))
    restored = None
    snap = None
    try:
        await h.fs.write("kept.txt", b"workspace file")
        await h.fs.write("/home/agent/.config/tool.json", b"{}")
        # the secret is in a live process's environment (given per exec), not in a file
        p = await h.process.spawn(["sh", "-c", 'echo "$API_TOKEN" >/dev/null; sleep 60'],
                                  env={"API_TOKEN": secret})
        snap = await snaps.snapshot(h, "after-setup")
        image = f"corral-snapshot:{snap.id}"
        info = provider.api.inspect_image(image)
        assert secret not in json.dumps(info) and "spec-env" not in json.dumps(info)
        history = json.dumps(provider.api.history(image))  # `docker history`: each layer's
        assert secret not in history and "spec-env" not in history  # command and comment
        layers = b"".join(provider.api.get_image(image))  # every layer, as `docker save`
        assert secret.encode() not in layers
        assert b"workspace file" in layers  # the scan looked at the real contents
        restored = await snaps.restore(snap, SandboxSpec())
        assert await restored.fs.read("kept.txt") == b"workspace file"
        assert await restored.fs.read("/home/agent/.config/tool.json") == b"{}"
        assert (await restored.process.exec("touch new && id -u")).stdout == b"1000\n"
        await p.kill()
        await p.aclose()
        # a secret written into a file refuses the snapshot, naming the secret
        await h.fs.write("leak.txt", f"token={secret}".encode())
        with pytest.raises(SecretInSnapshotError, match="API_TOKEN"):
            await snaps.snapshot(h)
        assert await snaps.exists(snap)
        await snaps.delete(snap)
        assert not await snaps.exists(snap)
    finally:
        await provider.destroy(h.ref)
        if restored is not None:
            await provider.destroy(restored.ref)
        if snap is not None:
            await snaps.delete(snap)
    # the deleted snapshot's image went with the last sandbox restored from it
    # (this snapshot's only: another test may be making and deleting its own meanwhile)
    assert snap is not None
    dangling = provider.api.images(filters={"dangling": True,
                                            "label": f"corral.snapshot={snap.id}"})
    assert dangling == []


def test_corral_exec_on_docker(corral_cmd: list[str], cli_env: dict[str, str]) -> None:
    r = subprocess.run([*corral_cmd, "exec", "--provider", "docker", "--env", "X=given", "--",
                        "sh", "-c", 'id -u; echo "$X"; cat; exit 3'], input=b"from stdin",
                       env=cli_env, capture_output=True, timeout=120)
    assert (r.returncode, r.stdout) == (3, b"1000\ngiven\nfrom stdin"), r.stderr
    killed = subprocess.run([*corral_cmd, "exec", "--provider", "docker", "--", "sh", "-c",
                             "kill -TERM $$"], env=cli_env, capture_output=True, timeout=120)
    assert killed.returncode == 143 and b"killed by SIGTERM" in killed.stderr


@pytest.mark.anyio
async def test_a_junk_created_at_label_does_not_stop_the_listing() -> None:
    # Anyone who can reach the daemon can label a container; one bad label must not stop
    # corral gc and the reaper from listing (and collecting) every other sandbox.
    provider = DockerProvider()
    name = f"junk-{time.time_ns()}"
    subprocess.run(["docker", "create", "--name", container_name(name), "--label", "corral=1",
                    "--label", f"corral.sandbox={name}", "--label", "corral.created-at=junk",
                    provider.image, "true"], check=True, capture_output=True, timeout=60)
    good = await provider.create(SandboxSpec())
    try:
        listed = {sb.id: sb for sb in await provider.labelled()}
        assert good.id in listed and name in listed
        assert listed[name].created_at > 0  # the daemon's own creation time instead
    finally:
        subprocess.run(["docker", "rm", "-f", container_name(name)], capture_output=True,
                       timeout=60)
        await provider.destroy(good.id)
