"""The server's configured limits on generation, checked in one place.

`GenerationConfig.validate` owns what any decoding may ask (types and ranges); this module owns what this server
allows on top of that (`Settings`), for the settings of a request, an admin's new defaults and a model's own
defaults alike: requests and admins are refused with 422, a model's defaults are clamped (with a warning) so that
a model directory with generous defaults can still be served.
"""

from __future__ import annotations

import logging
from typing import Any

from model.generation import GenerationConfig
from server.errors import InvalidSettings
from server.settings import Settings

log = logging.getLogger(__name__)


def ceilings(settings: Settings) -> dict[str, int]:
    """The largest value of each bounded generation setting on this server."""
    beam = min(settings.max_beam_size, settings.max_batch_rows)  # a sentence's beams must fit in one batch
    return {"beam_size": beam, "num_hypotheses": beam, "max_new_tokens": settings.max_new_tokens,
            "min_new_tokens": settings.max_new_tokens}


def check(config: GenerationConfig, settings: Settings) -> GenerationConfig:
    """config, if it is within this server's limits; InvalidSettings (422) naming the setting otherwise."""
    for name, ceiling in ceilings(settings).items():
        if getattr(config, name) > ceiling:
            raise InvalidSettings(f"{name} must be at most {ceiling} on this server")
    return config


def clamp(config: GenerationConfig, settings: Settings) -> GenerationConfig:
    """config brought within this server's limits (a model's defaults)."""
    clamped = config.update(**{name: min(getattr(config, name), ceiling)
                               for name, ceiling in ceilings(settings).items()})
    if clamped != config:
        log.warning("model defaults clamped to the server's limits: %s", clamped)
    return clamped


def request_config(defaults: GenerationConfig, options: dict[str, Any], alternatives: int,
                   settings: Settings) -> GenerationConfig:
    """A request's settings: the model's defaults updated by its options; n-best when alternatives are asked."""
    if alternatives > settings.max_alternatives:
        raise InvalidSettings(f"alternatives must be at most {settings.max_alternatives}")
    try:
        config = defaults.update(**options)
        if alternatives:  # every hypothesis the beam holds: the ones that read the same are dropped (server/plan.py)
            beam = max(config.beam_size, alternatives + 1)
            config = config.update(beam_size=beam, num_hypotheses=beam)
    except ValueError as exc:
        raise InvalidSettings(str(exc)) from exc
    return check(config, settings)


def source_limit(settings: Settings, max_positions: int) -> int:
    """The longest source a batch takes: the server's limit, within the model's positions."""
    return min(settings.max_source_tokens, max_positions)
