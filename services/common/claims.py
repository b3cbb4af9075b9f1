"""Payloads over NATS's message size limit, kept in a JetStream stream and named by a key (a
"claim"): the message on the bus carries only the key, its receiver fetches the bytes and
deletes them. JetStream is spoken directly, as request/reply on ``$JS.API`` subjects with JSON
bodies, over the service's one connection (``Wire``): no second client.

The stream (made on first use, or an existing one brought to these settings): subjects
``$CLAIMS.<stream>.>`` (named after it, as ``$KV.<bucket>`` is after a key-value bucket), file
storage, ``max_age`` = the claims' time to live (what nobody fetched is dropped), the replicas
the caller asks for (3 on a three-node cluster), discard old.

A claim is cut into chunks, chunk ``i`` stored at ``$CLAIMS.<stream>.<id>.<i>``; its key is
``<id>.<count>.<size>`` (a random 128-bit id in hex, the number of chunks, the number of bytes).
The order is in the subjects, not in the stream's sequence numbers: chunks of puts running at
the same time interleave in the stream, and a publish retried after a lost acknowledgement
could store a chunk twice (the ``Nats-Msg-Id`` header makes the server drop such a copy, and
if one got through the reader would still see a single chunk ``i``). Each chunk is read with
``STREAM.MSG.GET`` ``{"last_by_subj": ...}``, answered by the stream's leader: a claim read
right after its put is there (a direct get may be answered by a replica still behind). The
count says when the claim is whole (a chunk gone is ``ClaimMissing``, not a short payload), the
size checks it; a delete is one purge of ``$CLAIMS.<stream>.<id>.>``.

Every request has a deadline. A step (setting up the stream, storing or reading one chunk, the
purge) takes at most ``timeout`` seconds: a cluster electing a leader (no answer, "temporarily
unavailable", a stream not listening for a moment) is waited out within it, by attempts of
1 s, 2 s, 4 s ...; everything stored or read again is the same bytes under the same id.
Failures are ``ClaimError`` subclasses: ``JetStreamUnavailable``, ``ClaimTimeout``,
``ClaimMissing`` and ``JetStreamError`` (the API's error object: ``code``, ``err_code``,
``description``)."""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import re
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import nats.errors

log = logging.getLogger("chorus.claims")

API = "$JS.API"
HEADROOM = 4096  # under max_payload: the JSON around a chunk read back, and a publish's headers
NANOS = 1_000_000_000  # the API's durations are in nanoseconds
FIRST_ATTEMPT_S = 1.0  # an unanswered request is sent again after 1 s, then 2 s, 4 s ... (within the step)
FIRST_PAUSE_S = 0.05  # before retrying a refusal that comes at once ("temporarily unavailable")

# the JetStream API's err_codes (nats-server's errors.json) that Claims tells apart
CLUSTER_NO_PEERS = 10005  # "no suitable peers for placement": a cluster still forming (or too small)
CLUSTER_NOT_AVAILABLE = 10008  # "JetStream system temporarily unavailable" (a leader election)
CLUSTER_NOT_LEADER = 10009
NO_MESSAGE = 10037
NOT_ENABLED_FOR_ACCOUNT = 10039
STREAM_NAME_IN_USE = 10058  # "already in use with a different configuration"
STREAM_NOT_FOUND = 10059
NOT_ENABLED = 10076
# tried again within the step's timeout; a cluster too small for the replicas asked for says so then
TRANSIENT = frozenset({CLUSTER_NO_PEERS, CLUSTER_NOT_AVAILABLE, CLUSTER_NOT_LEADER})

_KEY = re.compile(r"([0-9a-f]{32})\.([1-9][0-9]{0,9})\.([0-9]{1,15})")


class ClaimError(Exception):
    """A claim could not be stored, read or deleted."""


class JetStreamUnavailable(ClaimError):
    """No JetStream answers on this connection's servers (not enabled, or not for the account)."""


class ClaimTimeout(ClaimError):
    """JetStream did not answer in time."""


class ClaimMissing(ClaimError):
    """No such claim (any more): expired, deleted, or not a key ``put`` made."""


class JetStreamError(ClaimError):
    """The JetStream API refused a request (its error object: ``code`` is HTTP-like,
    ``err_code`` nats-server's own number, ``description`` what it said)."""

    def __init__(self, what: str, code: int, err_code: int, description: str) -> None:
        super().__init__(f"{what}: {description} (JetStream error {err_code}, code {code})")
        self.code = code
        self.err_code = err_code
        self.description = description


class Reply(Protocol):
    @property
    def data(self) -> bytes: ...


class Requester(Protocol):
    """The connection Claims needs (``Wire``, or nats-py's client)."""

    @property
    def max_payload(self) -> int: ...

    async def request(
        self, subject: str, payload: bytes, /, timeout: float, headers: dict[str, str] | None = None
    ) -> Reply: ...


@dataclass(frozen=True)
class Key:
    """What a claim's key says: its id, how many chunks, how many bytes."""

    id: str
    count: int
    size: int

    def __str__(self) -> str:
        return f"{self.id}.{self.count}.{self.size}"

    @classmethod
    def parse(cls, key: str) -> Key:
        match = _KEY.fullmatch(key)
        if match is None:
            raise ClaimMissing(f"{key[:80]!r} is not a claim's key")
        return cls(match[1], int(match[2]), int(match[3]))


class Claims:
    """Oversized payloads in the JetStream stream ``stream`` (see the module's docstring)."""

    def __init__(
        self, nc: Requester, stream: str, *, replicas: int = 1, ttl_s: float = 600.0, timeout: float = 5.0
    ) -> None:
        if not stream or re.search(r"[\s.*>/\\]", stream):
            raise ValueError(f"not a JetStream stream name: {stream!r}")
        self.nc = nc
        self.stream = stream
        self.prefix = f"$CLAIMS.{stream}"
        self.replicas = replicas
        self.ttl_s = ttl_s
        self.timeout = timeout
        self._ready = False  # the stream is known to exist with these settings
        self._lock = asyncio.Lock()

    @property
    def chunk_size(self) -> int:
        """The most bytes one chunk holds: stored, and read back in base64 inside JSON, each
        message within the server's ``max_payload``."""
        size = (self.nc.max_payload - HEADROOM) // 4 * 3
        if size <= 0:
            raise ClaimError(f"NATS's max_payload of {self.nc.max_payload} bytes leaves no room for a chunk")
        return size

    # the claims ---------------------------------------------------------------------------
    async def put(self, data: bytes) -> str:
        """Store ``data``; the key naming it (for ``get`` and ``delete``)."""
        await self._ensure()
        size = self.chunk_size
        key = Key(uuid.uuid4().hex, max(1, -(-len(data) // size)), len(data))
        stored = 0
        try:
            for i in range(key.count):
                await self._store(key, i, data[i * size : (i + 1) * size])
                stored += 1
        except ClaimError:
            if stored:  # not left for the time to live to clear
                await self.delete(str(key))
            raise
        return str(key)

    async def get(self, key: str) -> bytes:
        """The bytes ``key`` names; ``ClaimMissing`` when they are gone (expired, deleted)."""
        claim = Key.parse(key)
        data = b"".join([await self._chunk(claim, i) for i in range(claim.count)])
        if len(data) != claim.size:
            raise ClaimError(f"claim {key} holds {len(data)} bytes, not the {claim.size} it was stored with")
        return data

    async def delete(self, key: str) -> None:
        """Drop the claim's chunks (best effort: a failure is logged, the time to live clears them)."""
        try:
            claim = Key.parse(key)
            body = {"filter": f"{self.prefix}.{claim.id}.>"}
            await self._call(f"{API}.STREAM.PURGE.{self.stream}", _json(body), what=f"deleting claim {key}")
        except ClaimError as exc:
            log.debug("claim %s not deleted: %s", key[:80], exc)

    async def _store(self, key: Key, i: int, chunk: bytes) -> None:
        headers = {"Nats-Msg-Id": f"{key.id}.{i}", "Nats-Expected-Stream": self.stream}
        await self._call(
            f"{self.prefix}.{key.id}.{i}",
            chunk,
            what=f"storing chunk {i + 1} of {key.count} of a {key.size}-byte claim",
            headers=headers,
            no_responders=self._stream_gone,
        )

    async def _chunk(self, key: Key, i: int) -> bytes:
        what = f"reading chunk {i + 1} of {key.count} of claim {key}"
        body = {"last_by_subj": f"{self.prefix}.{key.id}.{i}"}
        try:
            answer = await self._call(f"{API}.STREAM.MSG.GET.{self.stream}", _json(body), what=what)
        except JetStreamError as exc:
            if exc.err_code in (NO_MESSAGE, STREAM_NOT_FOUND):
                raise ClaimMissing(f"claim {key} is gone (expired or deleted): {exc.description}") from exc
            raise
        message = answer.get("message")
        data = message.get("data", "") if isinstance(message, dict) else None  # an empty chunk has no data
        try:
            if not isinstance(data, str):
                raise TypeError("no message's data")
            return base64.b64decode(data, validate=True)
        except (binascii.Error, TypeError) as exc:
            raise ClaimError(f"{what}: an unreadable answer from JetStream ({exc})") from exc

    # the stream ---------------------------------------------------------------------------
    async def _ensure(self) -> None:
        """The stream exists with these settings: made if missing, brought to them if not."""
        if self._ready:
            return
        async with self._lock:
            if self._ready:
                return
            info = await self._info()
            if info is None:
                config = {
                    "name": self.stream,
                    "subjects": [f"{self.prefix}.>"],
                    "retention": "limits",
                    "storage": "file",
                    "discard": "old",
                    "max_age": self._max_age,
                    "num_replicas": self.replicas,
                }
                try:
                    await self._call(
                        f"{API}.STREAM.CREATE.{self.stream}", _json(config), what=f"creating stream {self.stream}"
                    )
                except JetStreamError as exc:
                    if exc.err_code != STREAM_NAME_IN_USE:
                        raise
                    info = await self._info()  # made meanwhile, with other settings
            if info is not None:
                await self._align(info.get("config"))
            self._ready = True

    @property
    def _max_age(self) -> int:
        return round(self.ttl_s * NANOS)

    async def _info(self) -> dict[str, Any] | None:
        try:
            return await self._call(f"{API}.STREAM.INFO.{self.stream}", b"", what=f"looking up stream {self.stream}")
        except JetStreamError as exc:
            if exc.err_code == STREAM_NOT_FOUND:
                return None
            raise

    async def _align(self, config: Any) -> None:
        """An existing stream, used as it is but for what claims need: their subjects, their time
        to live, the replicas asked for (``STREAM.UPDATE``)."""
        if not isinstance(config, dict):
            raise ClaimError(f"stream {self.stream}: JetStream's answer has no configuration")
        wanted = dict(config)
        subjects = list(config.get("subjects") or [])
        if f"{self.prefix}.>" not in subjects:
            wanted["subjects"] = [*subjects, f"{self.prefix}.>"]
        wanted["max_age"] = self._max_age
        wanted["num_replicas"] = self.replicas
        wanted["discard"] = "old"
        if int(config.get("duplicate_window") or 0) > self._max_age:
            wanted["duplicate_window"] = self._max_age  # the server wants it within max_age
        if wanted == config:
            return
        log.info("stream %s: updating it for claims (replicas %d, max age %gs)", self.stream, self.replicas, self.ttl_s)
        await self._call(f"{API}.STREAM.UPDATE.{self.stream}", _json(wanted), what=f"updating stream {self.stream}")

    async def _stream_gone(self) -> None:
        """A chunk's publish found nobody listening: the stream was deleted (made again) or its
        cluster is electing a leader (it is there: the publish is tried again)."""
        self._ready = False
        await self._ensure()

    # requests -----------------------------------------------------------------------------
    async def _call(
        self,
        subject: str,
        body: bytes,
        *,
        what: str,
        headers: dict[str, str] | None = None,
        no_responders: Callable[[], Awaitable[None]] | None = None,
    ) -> dict[str, Any]:
        """One step's request: the answer's JSON (an error object raised as ``JetStreamError``),
        transient failures tried again until ``timeout`` seconds have passed. ``no_responders``:
        what to do when nobody listens on ``subject`` (else: no JetStream)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        attempt, pause = FIRST_ATTEMPT_S, FIRST_PAUSE_S
        while True:
            left = deadline - loop.time()
            waited = False
            try:
                reply = await self.nc.request(subject, body, timeout=max(0.001, min(attempt, left)), headers=headers)
                return _answer(reply.data, what)
            except TimeoutError:  # nats.errors.TimeoutError is one
                failure: ClaimError = ClaimTimeout(f"{what}: JetStream did not answer in {self.timeout:g}s")
                reason = f"no answer in {min(attempt, left):.3g}s"
                attempt, waited = attempt * 2, True
            except nats.errors.NoRespondersError as exc:
                if no_responders is None:
                    raise JetStreamUnavailable(f"{what}: no JetStream answers (is it enabled on the server?)") from exc
                await no_responders()
                failure = JetStreamUnavailable(f"{what}: stream {self.stream} took no message (has it a leader?)")
                reason = "no responders"
            except nats.errors.Error as exc:  # the connection is closed, or refuses the message
                raise ClaimError(f"{what}: {exc!r}") from exc
            except JetStreamError as exc:
                if exc.err_code in (NOT_ENABLED, NOT_ENABLED_FOR_ACCOUNT):
                    raise JetStreamUnavailable(str(exc)) from exc
                if exc.err_code not in TRANSIENT:
                    raise
                failure, reason = exc, exc.description
            left = deadline - loop.time()
            if left <= 0:
                raise failure
            log.debug("%s: %s; trying again", what, reason)
            if not waited:  # a refusal that came at once: not again at once
                await asyncio.sleep(min(pause, left))
                pause = min(pause * 2, 1.0)


def _json(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


def _answer(data: bytes, what: str) -> dict[str, Any]:
    """A JetStream API answer (a PubAck for a publish), or its error object raised."""
    try:
        answer = json.loads(data)
    except ValueError as exc:
        raise ClaimError(f"{what}: JetStream answered {data[:200]!r}") from exc
    if not isinstance(answer, dict):
        raise ClaimError(f"{what}: JetStream answered {data[:200]!r}")
    error = answer.get("error")
    if error is None:
        return answer
    if not isinstance(error, dict):
        raise JetStreamError(what, 0, 0, str(error))
    code, err_code = error.get("code"), error.get("err_code")
    raise JetStreamError(
        what,
        code if isinstance(code, int) else 0,
        err_code if isinstance(err_code, int) else 0,
        str(error.get("description") or "no description"),
    )
