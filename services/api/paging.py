"""Paginated lists, as EMQX v5: `?page=1&limit=100`, answered with
`{"data": [...], "meta": {"page", "limit", "count", "hasnext"}}`.

`count` is the number of items matching the filters (all pages), so a
client can show "1-100 of 5,000" and `hasnext` says whether another page
has items. Pages start at 1; a page past the end is an empty `data`, not an
error (as EMQX). A page or limit that is not a positive integer is a 400.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from services.api.errors import BadRequest

DEFAULT_LIMIT: Final = 100  # EMQX's default page size
MAX_LIMIT: Final = 10_000  # items per page at most: one answer stays a few MB


@dataclass(frozen=True, slots=True)
class Page:
    page: int = 1
    limit: int = DEFAULT_LIMIT

    @classmethod
    def of(cls, query: Mapping[str, str]) -> Page:
        return cls(
            _positive(query, "page", 1, None),
            _positive(query, "limit", DEFAULT_LIMIT, MAX_LIMIT),
        )

    def answer(
        self, items: Sequence[Any], render: Callable[[Any], Any] | None = None
    ) -> dict[str, Any]:
        """This page of `items` (every item matching, in a stable order) with its
        meta; `render` makes each item of the page only (a list of 50,000
        clients renders 100 of them)."""
        start = (self.page - 1) * self.limit
        data = list(items[start : start + self.limit])
        if render is not None:
            data = [render(item) for item in data]
        return {
            "data": data,
            "meta": {
                "page": self.page,
                "limit": self.limit,
                "count": len(items),
                "hasnext": start + self.limit < len(items),
            },
        }


def _positive(query: Mapping[str, str], name: str, default: int, most: int | None) -> int:
    text = query.get(name)
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise BadRequest(f"{name} must be a positive integer, not {text!r}") from None
    if value < 1 or (most is not None and value > most):
        bound = f" at most {most}" if most is not None else ""
        raise BadRequest(f"{name} must be a positive integer{bound}, not {value}")
    return value
