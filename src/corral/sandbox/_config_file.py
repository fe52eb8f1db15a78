"""``corral.toml``: a sandbox definition as a file.

Shape (every table optional)::

    id = "triage-bot"

    [provider]
    name = "bubblewrap"          # other keys configure the provider

    [workspace]
    instructions = "Fix the failing test."
    setup = ["cd app", "export CI=1", { parallel = ["make a", "make b"] },
             { run = "make all", timeout = "1h" }]
    [workspace.source]           # git (url), local (path), files, or none
    url = "https://example.org/repo.git"
    ref = "main"
    depth = 1
    [workspace.scripts]
    test = "pytest -q"

    [secrets]                    # values never live in this file
    GITHUB_TOKEN = { env = "GITHUB_TOKEN" }

    [policy]
    allow = ["pytest *"]
    deny = ["rm -rf *"]
    default = "ask"
    network = "deny"             # "allow" + allow_hosts: only these, via the egress proxy
    # allow_hosts = ["pypi.org", "*.pythonhosted.org", "api.example.com:8443"]

    [lifecycle]
    reuse = "thread"
    snapshot = "after-setup"
    keep_alive = "2h"

Unknown keys and bad values are :class:`~corral._errors.ConfigError` naming the key and
its line in the file. The file may be at most :data:`MAX_CONFIG_BYTES` (1 MiB) and nest
arrays and tables at most as deep as Python's TOML parser can go; beyond either it is
refused with one error line (:func:`read_toml`, also used for ``corral serve --config``).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from corral._errors import ConfigError
from corral.sandbox._definition import Sandbox

__all__ = [
    "CONFIG_NAME",
    "MAX_CONFIG_BYTES",
    "dump_config",
    "find_config",
    "load_config",
    "locate_key",
    "read_toml",
]

CONFIG_NAME = "corral.toml"
MAX_CONFIG_BYTES = 1 << 20
"""Largest configuration file corral reads (1 MiB): a definition is a page of settings, and
what it holds ends up in every run record."""


def read_toml(file: Path, what: str = "") -> tuple[str, dict[str, Any]]:
    """The text and parsed data of the TOML ``file``; every problem is one
    :class:`ConfigError` line naming the file (and ``what`` it is, when given) and the fix:
    missing, unreadable, larger than :data:`MAX_CONFIG_BYTES`, not UTF-8, invalid or
    nested too deeply."""
    name = f"{what} {file}" if what else str(file)
    try:
        with file.open("rb") as f:
            # read one byte past the limit instead of trusting stat (a FIFO, /dev/zero)
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"{name}: no such file; create it or pass --config PATH") from None
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{name}: larger than the limit of {MAX_CONFIG_BYTES >> 20} MiB; "
                          "a definition is settings, keep data in the workspace")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{name}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        return text, tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{name}: invalid TOML: {exc}") from None
    except RecursionError:
        # tomllib recurses once per nested array or inline table
        raise ConfigError(f"{name}: invalid TOML: arrays or tables nested too deeply") from None

_HEADER_RE = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_KEY_RE = re.compile(
    r"^\s*((?:[A-Za-z0-9_-]+|\"[^\"]*\"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_-]+|\"[^\"]*\"|'[^']*'))*)\s*="
)
_FIELD_RE = re.compile(r"^(?:unknown key ')?([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)")


def _split_key(text: str) -> tuple[str, ...]:
    parts = re.findall(r"\"[^\"]*\"|'[^']*'|[A-Za-z0-9_-]+", text)
    return tuple(p[1:-1] if p[:1] in "\"'" else p for p in parts)


def locate_key(text: str, path: tuple[str, ...]) -> int | None:
    """The 1-based line where the key ``path`` is written in TOML ``text``, if found."""
    if not path:
        return None
    table: tuple[str, ...] = ()
    fallback: int | None = None
    for lineno, line in enumerate(text.splitlines(), start=1):
        h = _HEADER_RE.match(line)
        if h and not line.lstrip().startswith("#"):
            table = _split_key(h.group(1))
            if table == path:
                return lineno
            continue
        k = _KEY_RE.match(line)
        if not k:
            continue
        full = table + _split_key(k.group(1))
        if full == path:
            return lineno
        # inline tables: `source = { url = "…", brnach = "x" }`
        n = len(full)
        if full == path[:n] and n < len(path):
            rest = line[k.end() :]
            if re.search(r"(^|[{,\s])" + re.escape(path[-1]) + r"\s*=", rest):
                return lineno
        if fallback is None and full[-1:] == path[-1:] and full[: len(table)] == path[: len(table)]:
            fallback = lineno
    return fallback


def _with_line(exc: ConfigError, text: str, file: Path) -> ConfigError:
    msg = str(exc)
    m = _FIELD_RE.match(msg)
    line = None
    if m:
        path = tuple(m.group(1).split("."))
        if path and path[0] == "sandbox":
            path = path[1:]
        while path and line is None:
            line = locate_key(text, path)
            path = path[:-1]
    where = f"{file}:{line}" if line else str(file)
    return ConfigError(f"{where}: {msg}")


def load_config(path: str | Path, *, environ: Mapping[str, str] | None = None) -> Sandbox:
    """Read ``corral.toml`` at ``path`` into a :class:`Sandbox`.

    Relative local source paths are resolved against the file's directory. Secrets are
    read from the host environment (or files) named in the file.
    """
    file = Path(path)
    text, data = read_toml(file)
    source = (
        data.get("workspace", {}).get("source") if isinstance(data.get("workspace"), dict) else None
    )
    if isinstance(source, dict) and isinstance(source.get("path"), str):
        local = Path(source["path"]).expanduser()
        if not local.is_absolute():
            source["path"] = str((file.parent / local).resolve())
    try:
        return Sandbox.from_dict(data, environ=environ)
    except ConfigError as exc:
        raise _with_line(exc, text, file) from None


AGENT_KEYS = ("harness", "model", "agent", "agent_command")


def agent_table(path: str | Path) -> dict[str, str]:
    """The ``[agent]`` table of ``corral.toml`` at ``path``: defaults for ``corral run``'s
    ``--harness``, ``--model``, ``--agent`` and ``--agent-command`` (flags win), e.g.
    ``[agent]`` ``harness = "acp"`` ``agent = "opencode"``. ``{}`` without one."""
    file = Path(path)
    text, data = read_toml(file)
    table = data.get("agent")
    if table is None:
        return {}
    if not isinstance(table, dict):
        raise ConfigError(f"{file}: [agent] must be a table with keys {', '.join(AGENT_KEYS)}")
    out: dict[str, str] = {}
    for key, value in table.items():
        if key not in AGENT_KEYS:
            raise _with_line(ConfigError(f"[agent] has no key {key!r}; known: "
                                         f"{', '.join(AGENT_KEYS)}"), text, file)
        if not isinstance(value, str) or not value.strip():
            raise _with_line(ConfigError(f"[agent] {key} must be a non-empty string"), text,
                             file)
        out[key] = value
    return out


def find_config(start: str | Path) -> Path | None:
    """``corral.toml`` in ``start`` or the nearest parent directory, if any."""
    here = Path(start).resolve()
    for d in (here, *here.parents):
        candidate = d / CONFIG_NAME
        if candidate.is_file():
            return candidate
    return None


# ---------------------------------------------------------------------- writing
def _toml_str(s: str) -> str:
    out = ['"']
    for ch in s:
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _toml_key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else _toml_str(k)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return _toml_str(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return (
            "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + " }"
        )
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def _table(name: str, data: Mapping[str, Any], out: list[str]) -> None:
    scalars = {k: v for k, v in data.items() if v is not None}
    out.append(f"\n[{name}]")
    for k, v in scalars.items():
        out.append(f"{_toml_key(k)} = {_toml_value(v)}")


def dump_config(sandbox: Sandbox) -> str:
    """``corral.toml`` text for ``sandbox`` (hooks and secret values are not written;
    secrets appear only if they were read from the environment or a file)."""
    d = sandbox.to_dict()
    out: list[str] = [f"id = {_toml_str(d['id'])}"]
    _table("provider", d["provider"], out)
    ws = d["workspace"]
    _table("workspace", {k: v for k, v in ws.items()
                         if k in ("instructions", "setup", "max_copy_size")}, out)
    source = {k: v for k, v in ws["source"].items() if v is not None}
    _table("workspace.source", source, out)
    if ws["scripts"]:
        _table("workspace.scripts", ws["scripts"], out)
    if d["secrets"]:
        _table("secrets", d["secrets"], out)
    _table("policy", d["policy"], out)
    _table("lifecycle", d["lifecycle"], out)
    return "\n".join(out) + "\n"
