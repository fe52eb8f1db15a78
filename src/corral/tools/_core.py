"""Host tools: the application's Python functions, typed, validated and named.

A :class:`HostTool` wraps a sync or async callable. Its JSON schema comes from the type
hints of its parameters (a pydantic model built with ``create_model``), or, when the only
parameter is annotated with a pydantic model, from that model. A parameter annotated
:class:`ToolContext` is not part of the schema: the caller fills it in (run id, tool name).

A :class:`Toolset` holds tools by unique name, validates arguments (``ToolArgumentsError``
names every bad field) and runs them (sync callables in a worker thread, so a slow one
does not stall the event loop).
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, cast, get_type_hints, overload, runtime_checkable

import anyio
import anyio.to_thread
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, create_model

from corral._errors import ConfigError, CorralError

__all__ = [
    "HostTool",
    "ToolArgumentsError",
    "ToolContext",
    "ToolError",
    "ToolLike",
    "Toolset",
    "UnknownToolError",
    "result_text",
    "tool",
]

NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,48}$")
"""Tool names: what MCP clients accept once prefixed (``mcp__corral__<name>`` <= 64)."""


class ToolError(CorralError):
    """A host tool could not be run (base of the tool errors)."""


class UnknownToolError(ToolError, LookupError):
    """No tool of that name in the toolset."""


class ToolArgumentsError(ToolError, ValueError):
    """The arguments do not match the tool's schema; the message names each bad field."""


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a tool may learn about the call (inject it by annotating a parameter)."""

    tool: str
    run_id: str | None = None
    call_id: str | None = None
    tool_use_id: str | None = None
    """The agent's own id of the call (its journal's tool call id), when its CLI names it
    (Claude Code does); ``None`` otherwise."""


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True, slots=True)
class HostTool:
    """One host tool: ``name``, ``description``, ``input_schema`` (a JSON object schema),
    ``approval`` (the call waits for a human's allow/deny first) and the callable."""

    name: str
    description: str
    fn: Callable[..., Any]
    model: type[BaseModel]
    approval: bool = False
    whole_model: str | None = None
    """Name of the parameter that receives the whole validated model (model-typed tools)."""
    context_param: str | None = None

    @classmethod
    def from_function(cls, fn: Callable[..., Any], *, name: str | None = None,
                      description: str | None = None, approval: bool = False) -> HostTool:
        """Build a tool from a typed callable. Raises :class:`ConfigError` for a bad name,
        a parameter without a type hint, or ``*args``/``**kwargs``."""
        tool_name: str = name or str(getattr(fn, "__name__", ""))
        if not NAME_RE.match(tool_name):
            raise ConfigError(f"host tool name {tool_name!r} is invalid: use 1-48 letters, "
                              "digits, '_' or '-'")
        desc = description if description is not None else inspect.getdoc(fn) or ""
        try:
            hints = get_type_hints(fn)
        except Exception as exc:  # noqa: BLE001 - unresolved forward refs and the like
            raise ConfigError(f"host tool {tool_name!r}: cannot read its type hints: {exc}"
                              ) from None
        sig = inspect.signature(fn)
        fields: dict[str, Any] = {}
        context_param: str | None = None
        for p in sig.parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise ConfigError(f"host tool {tool_name!r}: *args/**kwargs cannot be "
                                  "described by a schema; name every parameter")
            if p.kind is p.POSITIONAL_ONLY:
                raise ConfigError(f"host tool {tool_name!r}: positional-only parameter "
                                  f"{p.name!r}; tools are called with keyword arguments")
            if p.name not in hints:
                raise ConfigError(f"host tool {tool_name!r}: parameter {p.name!r} needs a "
                                  "type hint (it becomes the tool's JSON schema)")
            hint = hints[p.name]
            if hint is ToolContext:
                context_param = p.name
                continue
            default = ... if p.default is p.empty else p.default
            fields[p.name] = (hint, default)
        if len(fields) == 1:
            (only, (hint, _d)), = fields.items()
            if isinstance(hint, type) and issubclass(hint, BaseModel):
                return cls(tool_name, desc, fn, hint, approval, only, context_param)
        model = create_model(f"{tool_name}_args", __base__=_Args, **fields)
        return cls(tool_name, desc, fn, model, approval, None, context_param)

    @property
    def input_schema(self) -> dict[str, Any]:
        """The JSON schema of the arguments (always ``type: object``)."""
        schema = self.model.model_json_schema()
        schema.pop("title", None)
        schema.setdefault("type", "object")
        schema.setdefault("properties", {})
        return schema

    def validate(self, args: Any) -> BaseModel:
        """Validate ``args`` (a JSON object; ``None`` means ``{}``)."""
        if args is None:
            args = {}
        if not isinstance(args, Mapping):
            raise ToolArgumentsError(f"tool {self.name!r}: arguments must be a JSON object, "
                                     f"got {type(args).__name__}")
        try:
            return self.model.model_validate(dict(args))
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(x) for x in e['loc']) or '(arguments)'}: {e['msg']}"
                for e in exc.errors()
            )
            raise ToolArgumentsError(f"tool {self.name!r}: bad arguments: {problems}"
                                     ) from None

    async def run(self, args: Any, context: ToolContext | None = None) -> Any:
        """Validate and run; returns the callable's value (sync ones run in a thread whose
        result is abandoned if the caller is cancelled: Python cannot stop a thread)."""
        parsed = self.validate(args)
        if self.whole_model is not None:
            kwargs: dict[str, Any] = {self.whole_model: parsed}
        else:
            kwargs = {k: getattr(parsed, k) for k in type(parsed).model_fields}
        if self.context_param is not None:
            kwargs[self.context_param] = context or ToolContext(tool=self.name)
        if inspect.iscoroutinefunction(self.fn):
            return await cast(Callable[..., Awaitable[Any]], self.fn)(**kwargs)
        value = await anyio.to_thread.run_sync(lambda: self.fn(**kwargs),
                                               abandon_on_cancel=True)
        if inspect.isawaitable(value):
            return await value
        return value


_ANY: TypeAdapter[Any] = TypeAdapter(Any)


def result_text(value: Any) -> str:
    """A tool result as text for the agent: strings as is, anything else as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(_ANY.dump_python(value, mode="json"), ensure_ascii=False,
                      sort_keys=True)


@overload
def tool(fn: Callable[..., Any], /) -> HostTool: ...


@overload
def tool(*, name: str | None = None, description: str | None = None,
         approval: bool = False) -> Callable[[Callable[..., Any]], HostTool]: ...


def tool(fn: Callable[..., Any] | None = None, /, *, name: str | None = None,
         description: str | None = None, approval: bool = False
         ) -> HostTool | Callable[[Callable[..., Any]], HostTool]:
    """Decorator: ``@tool`` or ``@tool(name=..., description=..., approval=True)``."""
    if fn is not None:
        return HostTool.from_function(fn)

    def wrap(f: Callable[..., Any]) -> HostTool:
        return HostTool.from_function(f, name=name, description=description,
                                      approval=approval)

    return wrap


@runtime_checkable
class ToolLike(Protocol):
    """What a toolset holds: a :class:`HostTool`, or a remote stub
    (:class:`corral.tools._remote.RemoteTool`) whose run is delegated elsewhere."""

    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def approval(self) -> bool: ...

    @property
    def input_schema(self) -> dict[str, Any]: ...

    async def run(self, args: Any, context: ToolContext | None = None) -> Any: ...


class Toolset:
    """Tools by unique name."""

    def __init__(self, tools: Iterable[ToolLike | Callable[..., Any]] = ()) -> None:
        self._tools: dict[str, ToolLike] = {}
        for t in tools:
            self.add(t)

    def add(self, t: ToolLike | Callable[..., Any]) -> ToolLike:
        """Add a tool (a plain callable is wrapped with :meth:`HostTool.from_function`)."""
        host = t if isinstance(t, ToolLike) else HostTool.from_function(t)
        if host.name in self._tools:
            raise ConfigError(f"two host tools are named {host.name!r}; names must be unique")
        self._tools[host.name] = host
        return host

    def get(self, name: str) -> ToolLike:
        """The tool named ``name``; :class:`UnknownToolError` otherwise."""
        try:
            return self._tools[name]
        except (KeyError, TypeError):
            known = ", ".join(sorted(self._tools)) or "none"
            raise UnknownToolError(f"unknown host tool {name!r} (known: {known})") from None

    def __iter__(self) -> Iterator[ToolLike]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    async def call(self, name: str, args: Any, context: ToolContext | None = None) -> Any:
        """Validate ``args`` against tool ``name`` and run it."""
        return await self.get(name).run(args, context)
