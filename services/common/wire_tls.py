"""TLS for a ``Wire``: the context it is given (``tls=``), or one built here from file paths.

A connection is encrypted when its URL is ``tls://``, when ``Wire`` is given a context, or when
the server's INFO says ``tls_required`` (then with the system's trust store unless a context was
given). In NATS's default order the server's INFO comes in plain text and the TLS handshake
follows; ``tls_handshake_first`` is for servers configured with ``handshake_first`` (TLS from
the first byte). The server's certificate is checked against the URL's host, or
``tls_hostname`` (a cluster node learnt by IP address is checked against the name of the server
that announced it, as nats-py does)."""

from __future__ import annotations

import ssl
from pathlib import Path


def tls_context(
    ca: str | Path | None = None, cert: str | Path | None = None, key: str | Path | None = None
) -> ssl.SSLContext:
    """A client context: the server verified with the CA file ``ca`` (the system's trust store
    without it), and, for mutual TLS, the client certificate ``cert`` with its private ``key``
    (or a ``cert`` file holding both)."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca) if ca is not None else None)
    if cert is not None:
        context.load_cert_chain(str(cert), str(key) if key is not None else None)
    elif key is not None:
        raise ValueError("a TLS client key without its certificate")
    return context


def describe(exc: BaseException) -> str:
    """A TLS failure in a line (``ssl``'s own messages repeat the library's codes)."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"TLS: the server's certificate was refused: {exc.verify_message or exc.reason}"
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return f"TLS: {exc.reason.replace('_', ' ').lower()}"
    return str(exc)
