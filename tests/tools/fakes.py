"""A stand-in for DNS: tests never resolve real names."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Sequence

from services.tools.egress import IPAddress


class FakeResolver:
    """Answers from ``answers`` (name -> addresses); any other name fails like a lookup that
    found nothing. Records every lookup. ``hold`` makes lookups wait until it is set."""

    def __init__(self, answers: dict[str, Sequence[str]] | None = None) -> None:
        self.answers = {name: list(addrs) for name, addrs in (answers or {}).items()}
        self.lookups: list[tuple[str, int]] = []
        self.hold: asyncio.Event | None = None

    async def __call__(self, host: str, port: int) -> list[IPAddress]:
        self.lookups.append((host, port))
        if self.hold is not None:
            await self.hold.wait()
        if host not in self.answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [ipaddress.ip_address(a) for a in self.answers[host]]
