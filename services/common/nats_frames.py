"""NATS's client protocol as bytes: the frames a client writes (``pub``, ``sub``) and a reader
that cuts what the server sends into messages (MSG/HMSG, with their headers) and control lines
(INFO, PING, PONG, +OK, -ERR). No I/O here: ``wire.py`` feeds it from its socket."""

from __future__ import annotations

from collections.abc import Callable

CRLF = b"\r\n"
HEADER_LINE = b"NATS/1.0"
MAX_CONTROL_LINE = 1 << 20  # a longer line without CRLF is a broken stream (INFO can be long)

# a message: subject, subscription id, reply subject, headers (or None), status (503: no
# responders), payload
OnMessage = Callable[[str, int, str, "dict[str, str] | None", "int | None", bytes], None]


class ProtocolViolation(Exception):
    """The server's stream cannot be read (the connection is dropped and made again)."""


def parse_headers(block: bytes) -> tuple[dict[str, str], int | None]:
    """A header block (``NATS/1.0[ status]`` then ``Key: Value`` lines): the headers and the
    status code, if the line has one (503: no responders)."""
    lines = block.split(CRLF)
    first = lines[0]
    if not first.startswith(HEADER_LINE):
        raise ProtocolViolation("a header block without NATS/1.0")
    status_text = first[len(HEADER_LINE) :].strip()
    status = int(status_text[:3]) if status_text[:3].isdigit() else None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(b":")
        if sep:
            headers[name.strip().decode(errors="replace")] = value.strip().decode(errors="replace")
    return headers, status


def header_block(headers: dict[str, str]) -> bytes:
    lines = [HEADER_LINE]
    for name, value in headers.items():
        if "\r" in name or "\n" in name or "\r" in value or "\n" in value or ":" in name:
            raise ValueError(f"a NATS header cannot hold line breaks or a colon in its name: {name!r}")
        lines.append(f"{name}: {value}".encode())
    return CRLF.join(lines) + CRLF + CRLF


def pub(subject: str, payload: bytes, reply: str = "", headers: dict[str, str] | None = None) -> bytes:
    """A PUB (or, with headers, HPUB) frame."""
    to = f"{subject} {reply}" if reply else subject
    if headers:
        block = header_block(headers)
        return b"HPUB %s %d %d\r\n" % (to.encode(), len(block), len(block) + len(payload)) + block + payload + CRLF
    return b"PUB %s %d\r\n" % (to.encode(), len(payload)) + payload + CRLF


def sub(subject: str, queue: str, sid: int) -> bytes:
    return (f"SUB {subject} {queue} {sid}\r\n" if queue else f"SUB {subject} {sid}\r\n").encode()


class FrameReader:
    """Bytes in (``feed``, any cut), frames out, in order, through the two callbacks."""

    def __init__(self, on_message: OnMessage, on_control: Callable[[bytes], None]) -> None:
        self.buffer = bytearray()
        self._on_message = on_message
        self._on_control = on_control

    def feed(self, data: bytes) -> None:
        buf = self.buffer
        buf += data
        start = 0
        try:
            while True:
                end = buf.find(CRLF, start)
                if end < 0:
                    if len(buf) - start > MAX_CONTROL_LINE:
                        raise ProtocolViolation("a control line without an end")
                    return
                line = bytes(buf[start:end])
                if line.startswith((b"MSG ", b"HMSG ")):
                    taken = self._message(line, buf, end + 2)
                    if taken < 0:
                        return  # the payload is not all here yet
                    start = taken
                    continue
                start = end + 2
                self._on_control(line)
        finally:
            del buf[:start]

    def _message(self, line: bytes, buf: bytearray, body: int) -> int:
        """One MSG/HMSG whose control line ends at ``body``: where the next frame starts, or -1."""
        parts = line.split()
        try:
            if parts[0] == b"MSG":  # MSG subject sid [reply] size
                hsize, size = 0, int(parts[-1])
                reply = parts[3] if len(parts) == 5 else b""
            else:  # HMSG subject sid [reply] hsize size
                hsize, size = int(parts[-2]), int(parts[-1])
                reply = parts[3] if len(parts) == 6 else b""
            subject, sid = parts[1], int(parts[2])
        except (IndexError, ValueError) as exc:
            raise ProtocolViolation(f"bad message line {line[:80]!r}") from exc
        if hsize > size or size < 0:
            raise ProtocolViolation(f"bad message sizes {line[:80]!r}")
        if len(buf) < body + size + 2:
            return -1
        headers: dict[str, str] | None = None
        status = None
        if hsize:
            headers, status = parse_headers(bytes(buf[body : body + hsize]))
        self._on_message(subject.decode(), sid, reply.decode(), headers, status, bytes(buf[body + hsize : body + size]))
        return body + size + 2
