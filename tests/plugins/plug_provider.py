"""A test-only package's provider, registered through the ``corral.providers`` entry point.

It is the local provider under the name ``plug`` with its own typed configuration: a
required ``tag``, which ``destroy`` writes down (``$CORRAL_HOME/plug-destroyed.log``) so a
test sees which configuration the destroying process rebuilt the provider with. Everything
else is the local provider's real behaviour.
"""

from __future__ import annotations

from pathlib import Path

from corral.providers import ProviderConfig
from corral.providers._local import LocalHandle, LocalProvider
from corral.sandbox._contracts import SandboxRef

DIST = "corral-plug"
ENTRY_POINT = "plug = plug_provider:PlugProvider"


class PlugConfig(ProviderConfig):
    tag: str
    home: Path | None = None


class PlugHandle(LocalHandle):
    provider_name = "plug"


class PlugProvider(LocalProvider):
    config_model = PlugConfig
    provider_name = "plug"
    handle_class = PlugHandle

    def __init__(self, tag: str, home: Path | str | None = None) -> None:
        super().__init__(home)
        self.tag = tag

    async def destroy(self, ref: SandboxRef | str) -> None:
        sandbox_id = ref.id if isinstance(ref, SandboxRef) else ref
        log = self.base_dir.parent.parent / "plug-destroyed.log"
        with log.open("a") as f:
            f.write(f"{self.tag} {sandbox_id}\n")
        await super().destroy(ref)


def install(target: Path) -> Path:
    """Make ``target`` an importable "installed" copy of this package (the module plus a
    ``.dist-info`` with its entry point): put it on PYTHONPATH."""
    target.mkdir(parents=True, exist_ok=True)
    (target / "plug_provider.py").write_text(Path(__file__).read_text())
    info = target / "corral_plug-0.0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {DIST}\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text(f"[corral.providers]\n{ENTRY_POINT}\n")
    return target
