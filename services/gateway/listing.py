"""Cursor pagination of listed objects (input items, conversation items), as OpenAI pages them."""

from __future__ import annotations

from typing import Any

from services.gateway.errors import invalid


def page(items: list[dict[str, Any]], limit: int, order: str, after: str | None, before: str | None) -> dict[str, Any]:
    if not 1 <= limit <= 100:
        raise invalid("limit must be between 1 and 100.", "limit")
    if order not in ("asc", "desc"):
        raise invalid("order must be 'asc' or 'desc'.", "order")
    ordered = items if order == "asc" else list(reversed(items))
    ids = [i.get("id") for i in ordered]
    if after is not None:
        if after not in ids:
            raise invalid(f"No item with id '{after}'.", "after")
        ordered = ordered[ids.index(after) + 1 :]
    if before is not None:
        ids = [i.get("id") for i in ordered]
        if before in ids:
            ordered = ordered[: ids.index(before)]
    shown = ordered[:limit]
    return {
        "object": "list",
        "data": shown,
        "first_id": shown[0]["id"] if shown else None,
        "last_id": shown[-1]["id"] if shown else None,
        "has_more": len(ordered) > limit,
    }
