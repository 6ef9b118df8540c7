"""The `weir ctl` command: the group (`base`) with every command module's commands."""

from __future__ import annotations

from services.admin.ctl import manage, pubsub, system
from services.admin.ctl.base import ctl

COMMAND_MODULES = (pubsub, manage, system)  # imported for the commands they add to `ctl`

__all__ = ["ctl"]
