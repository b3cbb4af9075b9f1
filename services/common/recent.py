"""A bounded memory of ids seen lately (the generations a ``Cancel`` named: a job or request
that arrives after its cancel is never started). The oldest are forgotten first."""

from __future__ import annotations

from collections import OrderedDict

RECENT_CANCELS = 4096


class Recent:
    def __init__(self, size: int = RECENT_CANCELS) -> None:
        self.size = size
        self._ids: OrderedDict[str, None] = OrderedDict()

    def add(self, key: str) -> None:
        self._ids[key] = None
        self._ids.move_to_end(key)
        while len(self._ids) > self.size:
            self._ids.popitem(last=False)

    def __contains__(self, key: object) -> bool:
        return key in self._ids

    def __len__(self) -> int:
        return len(self._ids)
