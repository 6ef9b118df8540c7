"""A subscription's options, and a client's subscriptions as the cluster view
holds them: the live ones, the tombstones of those removed, and the floor a
session end set."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SubscriptionOptions:
    qos: int
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0
    subscription_id: int | None = None
    version: int = 0


@dataclass(slots=True)
class ClientSubs:
    """One client's subscriptions in a `ClusterView`, with the versions that
    decide which event wins (module docstring of services.state.view)."""

    floor: int = 0  # versions at or below this were cleared by a session end
    # None while empty: most clients a view knows hold no subscription and no
    # tombstone (two empty dicts were 128 bytes a client, online or gone)
    live: dict[str, SubscriptionOptions] | None = None
    gone: dict[str, int] | None = None  # filter -> tombstone version

    def held(self, filter_: str) -> int:
        opts = self.live.get(filter_) if self.live is not None else None
        if opts is not None:
            return opts.version
        return self.gone.get(filter_, 0) if self.gone is not None else 0

    def has(self, filter_: str) -> bool:
        return self.live is not None and filter_ in self.live

    def add(self, filter_: str, opts: SubscriptionOptions) -> None:
        if self.live is None:
            self.live = {}
        self.live[filter_] = opts

    def takes(self, filter_: str, version: int) -> bool:
        """Whether a subscription at `version` is newer than what is held;
        if so, a tombstone it replaces is dropped (the caller makes it live)."""
        if version <= self.floor:
            return False
        held = self.live.get(filter_) if self.live is not None else None
        if held is not None:
            return version > held.version
        gone = self.gone
        if gone:
            if version <= gone.get(filter_, 0):
                return False
            gone.pop(filter_, None)
        return True
