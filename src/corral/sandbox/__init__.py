"""Sandbox definitions and the sandbox contract.

A :class:`Sandbox` is provider + :class:`Workspace` + :class:`Policy` + :class:`Lifecycle`
(+ :class:`Hooks`); ``ensure`` resumes, restores or creates and bootstraps its instance. The
contract every provider and handle offers (DESIGN §2) is in :mod:`corral.abc` (``Provider``,
``Handle``, ``Process``, …); here are :class:`Capabilities` and the refs, specs and results
around it.
"""

from __future__ import annotations

from corral._lazy import TYPE_CHECKING, lazy_namespace

# Protocols live in corral.abc only: their old names here resolve with a warning
_MOVED = dict.fromkeys(
    ("FileSystem", "Handle", "Process", "ProcessApi", "Provider"), "corral.abc")

# The public names, listed once: resolved on first use (corral._lazy)
if TYPE_CHECKING or not lazy_namespace(globals(), moved=_MOVED):
    from corral.sandbox._bootstrap import (
        BootstrapResult as BootstrapResult,
        bootstrap as bootstrap,
    )
    from corral.sandbox._config_file import (
        dump_config as dump_config,
        find_config as find_config,
        load_config as load_config,
    )
    from corral.sandbox._contracts import (
        Capabilities as Capabilities,
        ExecResult as ExecResult,
        FileInfo as FileInfo,
        HostCommand as HostCommand,
        HostRoute as HostRoute,
        PathEscapeError as PathEscapeError,
        ResourceLimits as ResourceLimits,
        SandboxGoneError as SandboxGoneError,
        SandboxRef as SandboxRef,
        SandboxSpec as SandboxSpec,
        SnapshotRef as SnapshotRef,
        UnsupportedCapability as UnsupportedCapability,
    )
    from corral.sandbox._definition import Sandbox as Sandbox
    from corral.sandbox._ensure import Ensured as Ensured
    from corral.sandbox._gc import (
        GcReport as GcReport,
        LabelledSandbox as LabelledSandbox,
        collect_idle as collect_idle,
    )
    from corral.sandbox._gitsrc import GitError as GitError
    from corral.sandbox._hooks import (
        FileEvent as FileEvent,
        Hooks as Hooks,
    )
    from corral.sandbox._key import RunContext as RunContext
    from corral.sandbox._lifecycle import Lifecycle as Lifecycle
    from corral.policy._policy import (  # a definition holds a policy (corral.policy)
        Decision as Decision,
        Policy as Policy,
    )
    from corral.sandbox._redact import Redactor as Redactor
    from corral.sandbox._secrets import (
        SecretRef as SecretRef,
        Secrets as Secrets,
    )
    from corral.sandbox._setup_shell import SetupError as SetupError
    from corral.sandbox._sources import (
        Files as Files,
        GitSource as GitSource,
        LocalDir as LocalDir,
        NoSource as NoSource,
    )
    from corral.sandbox._transfer import (
        CopyTooLarge as CopyTooLarge,
        TransferError as TransferError,
        copy_dir_into as copy_dir_into,
    )
    from corral.sandbox._workspace import (
        Parallel as Parallel,
        Step as Step,
        Workspace as Workspace,
        parallel as parallel,
    )
