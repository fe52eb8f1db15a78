"""Write a one-file OCI image archive (for scripts/cluster.sh's pause image).

Usage: oci_image.py BINARY NAME OUT.tar

The archive holds one uncompressed layer with BINARY at /<basename> (mode 0755), run as the
entrypoint; ``ctr images import`` takes it under NAME. The archive is byte-for-byte the same
for the same binary (no timestamps), so its digest changes only when the binary does.
Standard library only: the cluster script runs it with the system's python3.
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
import tarfile
from pathlib import Path


def _tar(files: dict[str, tuple[bytes, int]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, (data, mode) in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _blob(data: bytes) -> tuple[str, str]:
    digest = hashlib.sha256(data).hexdigest()
    return f"sha256:{digest}", f"blobs/sha256/{digest}"


def _json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def build(binary: Path, name: str) -> bytes:
    """The OCI archive's bytes."""
    entry = "/" + binary.name
    layer = _tar({binary.name: (binary.read_bytes(), 0o755)})
    layer_digest, layer_path = _blob(layer)
    config = _json({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": [entry], "User": "0:0"},
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
    })
    config_digest, config_path = _blob(config)
    manifest = _json({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": config_digest, "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": layer_digest, "size": len(layer)}],
    })
    manifest_digest, manifest_path = _blob(manifest)
    index = _json({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest, "size": len(manifest),
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {"io.containerd.image.name": name,
                            "org.opencontainers.image.ref.name": name.rpartition(":")[2]},
        }],
    })
    return _tar({
        "oci-layout": (_json({"imageLayoutVersion": "1.0.0"}), 0o644),
        "index.json": (index, 0o644),
        layer_path: (layer, 0o644),
        config_path: (config, 0o644),
        manifest_path: (manifest, 0o644),
    })


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: oci_image.py BINARY NAME OUT.tar", file=sys.stderr)
        return 2
    binary, name, out = Path(argv[0]), argv[1], Path(argv[2])
    data = build(binary, name)
    tmp = out.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.replace(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
