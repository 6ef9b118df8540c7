"""Errors of the load generator: one tree, so the CLI can turn any of them into one line."""

from __future__ import annotations


class BenchError(Exception):
    """A run could not be carried out; retrying the same run will not help."""


class UsageError(BenchError):
    """Bad command-line arguments (exit status 2)."""


class ProtocolViolation(BenchError):
    """The broker sent bytes that are not MQTT."""


class BrokerUnavailable(BenchError):
    """Connecting, CONNACK or SUBACK failed or timed out."""
