"""TLS for the servers servelens runs: the dashboard and OTLP/HTTP (waitress, through
core.serving.TlsChannel) and OTLP/gRPC (grpc's own server credentials), from one
certificate and key.

Waitress has no TLS of its own. Its event loop reads and writes non-blocking sockets, so a
TLS channel needs three things a plain one does not: the handshake is driven by the loop
(read and write readiness) instead of at accept; a read or write that the TLS layer cannot
complete yet (SSLWantRead/WriteError) is "nothing now", not an error; and bytes the TLS
layer has already decrypted are drained in the same turn, since the socket will not poll
readable for data that is no longer in the kernel. The deadlines and the connection cap of
core.serving apply unchanged: a client that never finishes its handshake is a client that
never sends its headers.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any


class TlsError(ValueError):
    """The certificate or key cannot be used; the message names the file."""


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    """A server context with Python's secure defaults (TLS 1.2 or later)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(str(cert), str(key))
    except (OSError, ssl.SSLError) as exc:
        raise TlsError(f"cannot load the TLS certificate {cert} with key {key}: {exc}") from None
    return context


def grpc_credentials(cert: Path, key: Path) -> Any:
    import grpc

    server_context(cert, key)  # the same checks and messages before grpc sees the files
    return grpc.ssl_server_credentials([(Path(key).read_bytes(), Path(cert).read_bytes())])


def pinned_client_context(cert: Path) -> ssl.SSLContext:
    """A client context that trusts exactly `cert`, the certificate this process serves,
    whatever name it was issued for: for a connection to our own receiver on loopback (the
    demo's traffic), where 127.0.0.1 need not be one of the certificate's names. The chain
    is still verified: only a server holding that certificate's key is accepted."""
    context = ssl.create_default_context(cafile=str(cert))
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN  # a leaf may be its own anchor
    context.check_hostname = False
    return context

