"""Channel errors that services/mqtt/errors.py does not name (yet).

They join the same tree (subclasses of MQTTError) so the node handles them
like every other protocol error.
"""

from __future__ import annotations

from services.mqtt.errors import MQTTError
from services.mqtt.packets import ReasonCode


class RetainNotSupported(MQTTError):
    reason_code = ReasonCode.RETAIN_NOT_SUPPORTED


class SubscriptionIdentifiersNotSupported(MQTTError):
    reason_code = ReasonCode.SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED
