"""What ``corral serve`` is configured with: bind address, token, sandboxes, limits.

A configuration file (TOML, ``--config``) can name sandbox definitions that clients refer to
by name, and decide what clients may ask for inline::

    default_sandbox = "repo"
    allowed_providers = ["bubblewrap"]      # for inline {"provider": ...}; default bubblewrap
    workspace_roots = ["/srv/workspaces"]   # inline {"workspace": dir} must lie under one
    allowed_harnesses = ["claude-code", "command"]  # default: any harness
    default_harness = "claude-code"         # POST /v1/agui inputs that name none

    [sandboxes.repo]
    provider = "bubblewrap"
    workspace = "/srv/workspaces/repo"

    [sandboxes.repo.policy]                 # optional: agent runs ask before "git push *"
    allow = ["*"]
    ask = ["git push *"]

Inline workspaces are refused unless ``workspace_roots`` allows them: a workspace is a host
directory copied into the sandbox, so letting any client name one would let it read any
file the server can read.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from corral._errors import ConfigError
from corral._suggest import did_you_mean
from corral.sandbox._contracts import DEFAULT_PROVIDER

TOKEN_ENV: Final = "CORRAL_API_TOKEN"
DEFAULT_HEARTBEAT: Final = 15.0
DEFAULT_MAX_BODY: Final = 1 << 20
DEFAULT_MAX_ACTIVE_RUNS: Final = 200
DEFAULT_REAP_INTERVAL: Final = 60.0
DEFAULT_REAP_TTL: Final = 3600.0
MIN_TOKEN_CHARS: Final = 16


@dataclass(frozen=True, slots=True)
class SandboxDefinition:
    """Where a run executes: a provider and, optionally, a host directory copied into the
    sandbox's workspace."""

    provider: str = DEFAULT_PROVIDER
    workspace: str | None = None
    policy: Mapping[str, Any] | None = None
    """The operator's policy for agent runs in it (``[sandboxes.NAME.policy]``, the
    keys of a corral.toml ``[policy]``): ``ask`` verdicts become approvals, which the AG-UI
    endpoint shows as interrupts."""


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Everything the HTTP service needs besides the store."""

    host: str = "127.0.0.1"
    port: int = 8765
    store_url: str | None = None
    token: str | None = None
    """The bearer token clients must send; ``None`` means no auth (loopback only)."""
    sandboxes: Mapping[str, SandboxDefinition] = field(default_factory=dict)
    default_sandbox: str | None = None
    allowed_providers: Sequence[str] = (DEFAULT_PROVIDER,)
    workspace_roots: Sequence[str] = ()
    allowed_harnesses: Sequence[str] | None = None
    """Harnesses clients may start runs with (``command`` for command runs); ``None``: any."""
    default_harness: str | None = None
    """The harness of an AG-UI input (``POST /v1/agui``) that names none."""
    heartbeat: float = DEFAULT_HEARTBEAT
    """Seconds between SSE comment lines on an idle stream."""
    max_body: int = DEFAULT_MAX_BODY
    max_active_runs: int = DEFAULT_MAX_ACTIVE_RUNS
    reaper: bool = True
    reap_interval: float = DEFAULT_REAP_INTERVAL
    reap_ttl: float = DEFAULT_REAP_TTL
    """A run nobody watched for this long is expired (cancelled) by the reaper."""
    presence_interval: float = 1.0
    """How often viewer presence is re-asserted in the store and dead drivers are looked for."""
    lease_ttl: float | None = None

    def validate(self) -> None:
        """Refuse configurations that would be unsafe or cannot work (:class:`ConfigError`)."""
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"--port must be 0..65535, got {self.port}")
        if not is_loopback(self.host) and not self.token:
            raise ConfigError(
                f"refusing to serve on {self.host!r} without authentication: set "
                f"{TOKEN_ENV} to a secret of at least {MIN_TOKEN_CHARS} characters, or bind "
                "to 127.0.0.1"
            )
        if self.token is not None and len(self.token) < MIN_TOKEN_CHARS:
            raise ConfigError(
                f"{TOKEN_ENV} is too short ({len(self.token)} characters); use at least "
                f"{MIN_TOKEN_CHARS}, e.g. the output of: python3 -c "
                "'import secrets; print(secrets.token_urlsafe(32))'"
            )
        if self.default_sandbox is not None and self.default_sandbox not in self.sandboxes:
            raise ConfigError(
                f"default_sandbox {self.default_sandbox!r} is not defined under [sandboxes]"
            )
        if self.heartbeat <= 0:
            raise ConfigError("the SSE heartbeat interval must be more than 0 seconds")
        if self.reap_interval <= 0:
            raise ConfigError("--reap-interval must be more than 0 seconds")
        if self.reap_ttl < 0:
            raise ConfigError("--reap-ttl must be 0 seconds or more")


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and ``localhost``; false for everything else (0.0.0.0
    included: it listens on every interface)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def token_from_env() -> str | None:
    """``$CORRAL_API_TOKEN`` (``None`` when unset or empty)."""
    value = os.environ.get(TOKEN_ENV, "").strip()
    return value or None


def load_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read the TOML configuration file into :class:`ServerConfig` keyword arguments."""
    # here, not at the top: `corral serve --help` and `corral completion` read this module's
    # defaults, and the sandbox definitions behind read_toml are most of their start-up
    from corral.sandbox._config_file import read_toml

    p = Path(path)
    _text, raw = read_toml(p, "config file")
    known = {"sandboxes", "default_sandbox", "allowed_providers", "workspace_roots",
             "allowed_harnesses", "default_harness"}
    unknown = set(raw) - known
    if unknown:
        raise ConfigError(
            f"config file {str(p)!r}: unknown key(s) {sorted(unknown)}"
            f"{did_you_mean(min(unknown), known)}; known: {sorted(known)}"
        )
    out: dict[str, Any] = {}
    sandboxes: dict[str, SandboxDefinition] = {}
    for name, body in (raw.get("sandboxes") or {}).items():
        if not isinstance(body, dict):
            raise ConfigError(f"config file: [sandboxes.{name}] must be a table")
        extra = set(body) - {"provider", "workspace", "policy"}
        if extra:
            raise ConfigError(
                f"config file: [sandboxes.{name}] has unknown key(s) {sorted(extra)}"
                f"{did_you_mean(min(extra), ('provider', 'workspace', 'policy'))}; "
                "use provider, workspace and policy"
            )
        policy = body.get("policy")
        if policy is not None:
            policy = _policy(name, policy)
        provider = body.get("provider", DEFAULT_PROVIDER)
        workspace = body.get("workspace")
        if not isinstance(provider, str) or (workspace is not None and not isinstance(workspace, str)):
            raise ConfigError(f"config file: [sandboxes.{name}] provider and workspace are strings")
        if workspace is not None and not Path(workspace).is_dir():
            raise ConfigError(f"config file: [sandboxes.{name}] workspace {workspace!r} is not a "
                              "directory")
        sandboxes[name] = SandboxDefinition(provider=provider, workspace=workspace,
                                            policy=policy)
    out["sandboxes"] = sandboxes
    if "default_sandbox" in raw:
        if not isinstance(raw["default_sandbox"], str):
            raise ConfigError("config file: default_sandbox must be the name of a sandbox")
        out["default_sandbox"] = raw["default_sandbox"]
    if "default_harness" in raw:
        if not isinstance(raw["default_harness"], str):
            raise ConfigError("config file: default_harness must be a harness name")
        out["default_harness"] = raw["default_harness"]
    for key in ("allowed_providers", "workspace_roots", "allowed_harnesses"):
        if key in raw:
            value = raw[key]
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"config file: {key} must be a list of strings")
            out[key] = tuple(value)
    return out


def _policy(name: str, body: Any) -> dict[str, Any]:
    """A configured sandbox's policy table, checked as corral.toml's ``[policy]`` is."""
    from corral.sandbox._definition import Sandbox  # the sandbox machinery: only when used

    if not isinstance(body, dict):
        raise ConfigError(f"config file: [sandboxes.{name}.policy] must be a table")
    try:
        checked = Sandbox.from_dict({"policy": body}).policy
    except ConfigError as exc:
        raise ConfigError(f"config file: [sandboxes.{name}.policy]: {exc}") from None
    return dict(checked.to_dict())
