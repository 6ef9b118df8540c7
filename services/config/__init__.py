"""Weir's settings: each option declared once, in `services.config.settings`
(the tree), `listeners` and `auth` (its sections); `load` reads them from
the defaults, the TOML file, WEIR_* variables and flags. Services get plain
values from the tree, never the environment."""

from __future__ import annotations

from services.config.auth import AuthBackend
from services.config.declare import SettingsError
from services.config.listeners import ListenerConfig, Listeners
from services.config.loader import ENV_VARS, OPTIONS, load
from services.config.settings import Limits, Settings, exposure_error, is_loopback

__all__ = [
    "ENV_VARS",
    "OPTIONS",
    "AuthBackend",
    "Limits",
    "ListenerConfig",
    "Listeners",
    "Settings",
    "SettingsError",
    "exposure_error",
    "is_loopback",
    "load",
]
