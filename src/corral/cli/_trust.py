"""What a repository's own ``corral.toml`` may ask for.

A ``corral.toml`` that corral *finds* in the workspace belongs to the repository, and a
repository can be hostile: it is read as a request about the sandbox, never as the host's
configuration. A file the user names (``--config PATH``) or a definition built in Python is
the user's own and is trusted. A found file may not

- choose a provider that does not isolate (``local``: its setup and commands would run on
  this host) unless the user chose that provider on the command line;
- configure a provider's host-side settings (``[provider]`` keys beyond ``name``: paths of
  host programs, the host uid, directories), or raise its resource limits (``limits`` may
  only lower them);
- read a secret from a host file outside the directory that holds it;
- take the workspace from anywhere but its own directory (a ``local`` source outside it,
  or a ``git`` source, which the host clones with the user's credentials);
- give the sandbox the host's network (``network = "allow"`` without ``allow_hosts``
  shares the host's network namespace, its loopback services included), or name
  non-public addresses in ``allow_hosts`` (an IP literal there lets the egress proxy reach
  that address, e.g. ``127.0.0.1:*``); an allowlist of public hosts, which goes through
  corral's egress proxy, is a request it may make;
- loosen the command policy the user gets without it (:class:`Policy`'s defaults): no
  ``allow`` rules, ``default`` and ``unparseable`` at least as strict as the defaults
  (``ask``, ``deny``); ``deny`` and ``ask`` rules and a stricter ``file_write`` are fine;
- raise a limit the user set or gets by default: ``workspace.max_copy_size`` above
  ``$CORRAL_MAX_COPY_SIZE`` (else 1 GiB) unless ``--max-copy-size`` decides, a setup
  step's ``timeout`` above the default 30 minutes, ``lifecycle.keep_alive`` above the
  default 24 hours (or ``"never"``), ``lifecycle.checkpoint_max_size`` above the default
  1 GiB (a thread's checkpoints fill the shared store).

Each refusal is one line naming the key and the two ways forward. docs/security.md lists
every key of the file with what a found file may do with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from corral._errors import ConfigError
from corral.policy._allowlist import non_public, parse_allowlist
from corral.providers import get_provider
from corral.sandbox._contracts import DefaultLimits
from corral.sandbox._definition import Sandbox
from corral.sandbox._lifecycle import DEFAULT_CHECKPOINT_MAX_SIZE, DEFAULT_KEEP_ALIVE
from corral.policy._policy import Policy
from corral.sandbox._sources import GitSource, LocalDir
from corral.sandbox._transfer import CopyLimit
from corral._validate import format_size
from corral.sandbox._workspace import DEFAULT_STEP_TIMEOUT, Parallel, Step

__all__ = ["check_found_config"]


_RANK = {"allow": 0, "ask": 1, "deny": 2}


def check_found_config(sandbox: Sandbox, config: Path, *, provider_chosen: bool,
                       copy_limit_chosen: bool = False,
                       environ: Mapping[str, str] | None = None) -> None:
    """Raise :class:`ConfigError` if ``sandbox``, loaded from the repository's own
    ``config`` file, asks for something only the user may decide (see the module
    docstring). ``provider_chosen``: the user named the provider on the command line;
    ``copy_limit_chosen``: the user gave ``--max-copy-size`` (which replaces the file's);
    ``environ``: the user's environment (``$CORRAL_MAX_COPY_SIZE``), default ``os.environ``."""
    trust = f"pass --config {config} if you trust this file"
    _check_policy(sandbox.policy, config, trust)
    _check_time_limits(sandbox, config, trust)
    if not copy_limit_chosen and sandbox.workspace.copy_limit_bytes is not None:
        asked = sandbox.workspace.copy_limit_bytes
        users = CopyLimit.resolve(None, environ)
        if asked > users.max_bytes:
            raise ConfigError(
                f"{config}: workspace.max_copy_size {format_size(asked)} is above your limit "
                f"of {format_size(users.max_bytes)} (set by {users.origin}): a repository's "
                f"corral.toml may only lower it; pass --max-copy-size or {trust}"
            )
    host_side = sorted(set(sandbox.provider_config) - {"limits"})
    if host_side:
        raise ConfigError(
            f"{config}: [provider] sets {', '.join(host_side)}: a repository's corral.toml "
            f"cannot configure the provider's host-side settings; {trust}"
        )
    if "limits" in sandbox.provider_config:
        raised = _raised_limits(sandbox)
        if raised:
            raise ConfigError(
                f"{config}: [provider] limits raises {', '.join(raised)} above the default: a "
                f"repository's corral.toml may only lower limits; {trust}"
            )
    if not provider_chosen and not sandbox.get_provider().capabilities.isolated:
        raise ConfigError(
            f"{config}: provider {sandbox.provider_name!r} does not isolate (its setup "
            "and commands would run on this host): a repository's corral.toml cannot "
            f"choose it; pass --provider {sandbox.provider_name} or {trust}"
        )
    home = config.resolve().parent
    source = sandbox.workspace.source
    if isinstance(source, GitSource):
        raise ConfigError(
            f"{config}: workspace.source is a git repository, which corral would clone on "
            f"this host with your credentials: a repository's corral.toml cannot ask for "
            f"that; {trust}"
        )
    if isinstance(source, LocalDir) and not _inside(Path(source.path), home):
        raise ConfigError(
            f"{config}: workspace.source.path {source.path} is outside {home}: "
            f"a repository's corral.toml cannot copy host directories into the sandbox; "
            f"{trust}"
        )
    if sandbox.policy.direct_network:
        raise ConfigError(
            f"{config}: policy.network = \"allow\" without allow_hosts would put the sandbox "
            "on this host's network (its loopback services included): a repository's "
            f"corral.toml cannot ask for that; list the hosts in allow_hosts, or {trust}"
        )
    for rule in parse_allowlist(sandbox.policy.allow_hosts):
        net = rule.network
        if net is not None and (non_public(net[0]) or non_public(net[-1])):
            raise ConfigError(
                f"{config}: policy.allow_hosts names {rule.source}, not a public address: a "
                f"repository's corral.toml cannot open the egress proxy to it; {trust}"
            )
    for name, origin in sandbox.secrets.origins().items():
        raw = origin.get("file")
        if raw is None:
            continue
        if not _inside(Path(raw).expanduser(), home):
            raise ConfigError(
                f"{config}: secrets.{name} reads {raw}, outside {home}: a repository's "
                f"corral.toml cannot read host files into the sandbox; {trust}"
            )


def _check_policy(policy: Policy, config: Path, trust: str) -> None:
    """A found policy may add deny and ask rules and be stricter than the default policy,
    never looser: an allow rule (any) or a weaker ``default``/``unparseable``/``file_write``
    would let an agent run skip approvals the user gets without the file."""
    if policy.allow:
        raise ConfigError(
            f"{config}: policy.allow {list(policy.allow)!r} would let commands run without "
            "the approval you get by default: a repository's corral.toml may only add deny "
            f"and ask rules; {trust}"
        )
    base = Policy()
    for key in ("default", "unparseable", "file_write"):
        mine, default = getattr(policy, key), getattr(base, key)
        if _RANK[mine] < _RANK[default]:
            raise ConfigError(
                f"{config}: policy.{key} = {mine!r} is looser than the default {default!r}: "
                f"a repository's corral.toml may only make the policy stricter; {trust}"
            )


def _check_time_limits(sandbox: Sandbox, config: Path, trust: str) -> None:
    """Setup steps no longer than the default step timeout; sandboxes kept idle no longer
    than the default ``keep_alive``."""
    for i, item in enumerate(sandbox.workspace.steps):
        steps = item.steps if isinstance(item, Parallel) else (item,)
        for step in steps:
            assert isinstance(step, Step)
            if step.timeout > DEFAULT_STEP_TIMEOUT:
                raise ConfigError(
                    f"{config}: workspace.setup[{i}] timeout {_hours(step.timeout)} is above "
                    f"the default {_hours(DEFAULT_STEP_TIMEOUT)}: a repository's corral.toml "
                    f"may only lower it; {trust}"
                )
    keep = sandbox.lifecycle.keep_alive_seconds
    if keep is None or keep > DEFAULT_KEEP_ALIVE:
        asked = "never" if keep is None else _hours(keep)
        raise ConfigError(
            f"{config}: lifecycle.keep_alive {asked} keeps sandboxes longer than the default "
            f"{_hours(DEFAULT_KEEP_ALIVE)}: a repository's corral.toml may only lower it; "
            f"{trust}"
        )
    cap = sandbox.lifecycle.checkpoint_max_bytes
    if cap > DEFAULT_CHECKPOINT_MAX_SIZE:
        raise ConfigError(
            f"{config}: lifecycle.checkpoint_max_size {format_size(cap)} is above the default "
            f"{format_size(DEFAULT_CHECKPOINT_MAX_SIZE)} (checkpoints fill the shared store): "
            f"a repository's corral.toml may only lower it; {trust}"
        )


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:g}h" if seconds >= 3600 else f"{seconds / 60:g}m"


def _raised_limits(sandbox: Sandbox) -> list[str]:
    """The limits ``[provider] limits`` sets above the provider's defaults (all of them when
    the provider has no limits to compare with)."""
    asked, base = sandbox.get_provider(), get_provider(sandbox.provider_name)
    if not isinstance(asked, DefaultLimits) or not isinstance(base, DefaultLimits):
        return ["limits"]
    raised = []
    for field in ("memory_bytes", "pids", "cpus", "disk_bytes"):
        mine, default = getattr(asked.default_limits, field), getattr(base.default_limits, field)
        if default is not None and (mine is None or mine > default):
            raised.append(field.removesuffix("_bytes"))
    return raised


def _inside(path: Path, home: Path) -> bool:
    return path.resolve().is_relative_to(home)
