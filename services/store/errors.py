"""Errors of the session and queue stores: each says whether a retry can help."""

from __future__ import annotations


class SessionError(Exception):
    """Base of the session service's errors."""

    retriable = False


class Fenced(SessionError):
    """A newer owner holds the session: the writer must close its connection."""


class StoreUnavailable(SessionError):
    """The backing store did not answer in time; the caller may retry later."""

    retriable = True
