"""The base of a harness's configuration model (:class:`HarnessConfig`, pydantic): the
registry (:mod:`corral.harness._registry`) asks it for the factory's keyword arguments of a
run's harness configuration (:meth:`HarnessConfig.factory_kwargs`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from corral._errors import ConfigError
from corral._plugins import config_message

__all__ = ["HarnessConfig"]


class HarnessConfig(BaseModel):
    """Base of a harness's configuration model (its factory's ``config_model``).

    A harness is built from a run's harness configuration: its options
    (``RunRequest.options``) plus what the run decided for it (``argv``, ``policy``,
    ``permission_prompt``). Field names are the factory's keyword arguments: the keys the
    model declares and the run gave are passed (the factory's own defaults apply to the
    rest) and values are frozen. The other keys stay the run's options, which the harness
    reads from ``AgentRequest.options`` when it builds its command (and checks there); a
    model that sets ``extra="forbid"`` refuses them instead, naming the keys it takes.
    """

    model_config = ConfigDict(extra="ignore", frozen=True, arbitrary_types_allowed=True)

    @classmethod
    def factory_kwargs(cls, name: str, config: Mapping[str, Any]) -> dict[str, Any]:
        """The keyword arguments of harness ``name``'s factory: the keys of ``config`` this
        model declares, validated (a one-line :class:`ConfigError` otherwise)."""
        try:
            cfg = cls.model_validate(dict(config))
        except ValidationError as exc:
            raise ConfigError(config_message(exc, list(cls.model_fields), key="",
                                             where=f"harness {name!r}: ",
                                             unknown=f"for harness {name!r}")) from None
        return {key: getattr(cfg, key) for key in cfg.model_fields_set}

