"""The event catalogue (being built: issue 4)."""

from __future__ import annotations


class Event:
    pass
