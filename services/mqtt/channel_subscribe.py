"""SUBSCRIBE and UNSUBSCRIBE: what the channel checks itself, what it asks the node.

Theory of operation: each topic filter is checked here first (syntax, shared
and wildcard availability); a refused filter gets its failure code at once
and is not sent to the node. The rest go out as one SubscribeRequest (or
UnsubscribeRequest), and the node's answer, one code per filter it was
given, is merged back in order into the SUBACK (UNSUBACK). 3.x SUBACKs only
know the failure code 0x80 and 3.x UNSUBACKs carry no codes at all.
Breaking a MUST (no filters, a packet id in use, no local on a shared
subscription, a bad subscription identifier) raises an MQTTError: the
connection ends; so do more than `max_topic_filters` filters in one packet
(Weir's limit, Quota Exceeded).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from services.mqtt.actions import Action, Send, SubscribeRequest, UnsubscribeRequest
from services.mqtt.channel_config import ChannelConfig
from services.mqtt.channel_errors import SubscriptionIdentifiersNotSupported
from services.mqtt.errors import ProtocolError, QuotaExceeded, TopicFilterInvalid
from services.mqtt.packets import (
    ReasonCode,
    Suback,
    Subscribe,
    Subscription,
    Unsuback,
    Unsubscribe,
)
from services.mqtt.topics import parse_shared, validate_topic_filter

RC = ReasonCode


class SubscribeFlow:
    """One connection's SUBSCRIBE / UNSUBSCRIBE requests awaiting the node."""

    __slots__ = ("_config", "_subs", "_unsubs", "_v5")

    def __init__(self, config: ChannelConfig, v5: bool) -> None:
        self._config = config
        self._v5 = v5
        # Requests waiting for the node's answer, by packet id; None while there are
        # none (every idle connection held two empty dicts, 64 bytes each)
        self._subs: dict[int, list[int | None]] | None = None
        self._unsubs: dict[int, list[int | None]] | None = None

    def on_subscribe(self, s: Subscribe) -> list[Action]:
        if not s.subscriptions:
            raise ProtocolError("SUBSCRIBE without topic filters")
        if self._subs is not None and s.packet_id in self._subs:
            raise ProtocolError(f"SUBSCRIBE packet id {s.packet_id} is in use")
        self._check_count(len(s.subscriptions), "SUBSCRIBE")
        sub_id = None
        if s.properties.subscription_identifier:
            ids = s.properties.subscription_identifier
            if not self._config.subscription_identifiers:
                raise SubscriptionIdentifiersNotSupported("subscription identifiers are off")
            if len(ids) > 1 or ids[0] == 0:
                raise ProtocolError(f"bad subscription identifier {ids}")
            sub_id = ids[0]
        codes: list[int | None] = []
        accepted: list[Subscription] = []
        for sub in s.subscriptions:
            code = self._filter_refusal(sub)
            codes.append(code)
            if code is None:
                accepted.append(
                    replace(sub, qos=self._config.max_qos)
                    if sub.qos > self._config.max_qos
                    else sub
                )
        if not accepted:
            return [Send(Suback(s.packet_id, tuple(c for c in codes if c is not None)))]
        if self._subs is None:
            self._subs = {}
        self._subs[s.packet_id] = codes
        return [SubscribeRequest(s.packet_id, tuple(accepted), sub_id)]

    def _filter_refusal(self, sub: Subscription) -> int | None:
        """The SUBACK failure code for a filter the channel refuses, else None."""
        cfg = self._config
        try:
            validate_topic_filter(sub.topic_filter)
            shared = parse_shared(sub.topic_filter)
        except TopicFilterInvalid:
            return self._failure(RC.TOPIC_FILTER_INVALID)
        inner = sub.topic_filter
        if shared is not None:
            if self._v5 and sub.no_local:
                raise ProtocolError(f"no local on shared subscription {sub.topic_filter!r}")
            if not cfg.shared_subscriptions:
                return self._failure(RC.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED)
            inner = shared[1]
        if not cfg.wildcard_subscriptions and ("+" in inner or "#" in inner):
            return self._failure(RC.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED)
        return None

    def _check_count(self, n: int, what: str) -> None:
        if n > self._config.max_topic_filters:
            raise QuotaExceeded(f"{what} of {n} filters, over {self._config.max_topic_filters}")

    def _failure(self, code: int) -> int:
        return code if self._v5 else RC.UNSPECIFIED_ERROR

    def subscribed(self, packet_id: int, reason_codes: Sequence[int]) -> list[Action]:
        """SUBACK: `reason_codes` answer the SubscribeRequest's subscriptions in order."""
        codes = _taken(self._subs, packet_id)
        if codes is None:
            return []
        if not self._subs:
            self._subs = None
        merged = self._merge(codes, reason_codes)
        if not self._v5:
            merged = tuple(RC.UNSPECIFIED_ERROR if c >= 0x80 else c for c in merged)
        return [Send(Suback(packet_id, merged))]

    def on_unsubscribe(self, u: Unsubscribe) -> list[Action]:
        if not u.topic_filters:
            raise ProtocolError("UNSUBSCRIBE without topic filters")
        if self._unsubs is not None and u.packet_id in self._unsubs:
            raise ProtocolError(f"UNSUBSCRIBE packet id {u.packet_id} is in use")
        self._check_count(len(u.topic_filters), "UNSUBSCRIBE")
        codes: list[int | None] = []
        accepted: list[str] = []
        for topic_filter in u.topic_filters:
            try:
                validate_topic_filter(topic_filter)
            except TopicFilterInvalid:
                codes.append(RC.TOPIC_FILTER_INVALID)
                continue
            codes.append(None)
            accepted.append(topic_filter)
        if not accepted:
            return [Send(self._unsuback(u.packet_id, [c for c in codes if c is not None]))]
        if self._unsubs is None:
            self._unsubs = {}
        self._unsubs[u.packet_id] = codes
        return [UnsubscribeRequest(u.packet_id, tuple(accepted))]

    def unsubscribed(self, packet_id: int, reason_codes: Sequence[int]) -> list[Action]:
        """UNSUBACK: `reason_codes` answer the UnsubscribeRequest's filters in order."""
        codes = _taken(self._unsubs, packet_id)
        if codes is None:
            return []
        if not self._unsubs:
            self._unsubs = None
        return [Send(self._unsuback(packet_id, self._merge(codes, reason_codes)))]

    def _unsuback(self, packet_id: int, codes: Sequence[int]) -> Unsuback:
        return Unsuback(packet_id, tuple(codes)) if self._v5 else Unsuback(packet_id)

    @staticmethod
    def _merge(codes: list[int | None], answers: Sequence[int]) -> tuple[int, ...]:
        if sum(c is None for c in codes) != len(answers):
            raise ValueError(f"expected {sum(c is None for c in codes)} codes, got {answers}")
        it = iter(answers)
        return tuple(next(it) if c is None else c for c in codes)


def _taken(
    waiting: dict[int, list[int | None]] | None, packet_id: int
) -> list[int | None] | None:
    return waiting.pop(packet_id, None) if waiting is not None else None
