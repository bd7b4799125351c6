"""A WSGI app served by waitress on a background thread, with a prompt, clean stop.

Shared by the OTLP/HTTP receiver and the dashboard. Port 0 picks a free port.

Slow clients. Waitress alone lets ~100 slow sockets lock everyone out: it stops accepting
at `connection_limit` (100), and its only clock, `channel_timeout` (120 s), restarts with
every byte received, so a client dripping a header byte a second holds its connection for
ever. We keep waitress (its event loop, parser and task threads are well tested, and both
servers already run on it) and add what it lacks, in one server subclass and one channel
subclass: a header deadline and a total read deadline per request that no dripped byte
resets, a connection cap sized from RLIMIT_NOFILE, and, at that cap, eviction of the
connection that has waited longest without a request being served (slow or idle), so a
new client always gets in. Another server (cheroot, an asyncio one) would mean a second
code path for both apps and their clean shutdown, for the same few checks.
"""

from __future__ import annotations

import logging
import resource
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from waitress import wasyncore
from waitress.adjustments import Adjustments
from waitress.channel import HTTPChannel
from waitress.server import TcpWSGIServer
from waitress.task import ThreadedTaskDispatcher

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClientLimits:
    """How long a client may take, and how many may be connected, per server."""

    # From a request's first byte (a connection's first request: from accept) to its blank line.
    header_timeout: float = 10.0
    # The whole request, headers and body: 60 s reads the largest OTLP body at ~280 KB/s.
    read_timeout: float = 60.0
    # A keep-alive connection between requests (waitress' channel_timeout, whole seconds).
    idle_timeout: int = 60
    # Open connections per server; at most a quarter of RLIMIT_NOFILE (see connection_cap).
    max_connections: int = 10_000


LIMITS = ClientLimits()  # read when a server is built
WILDCARD_HOSTS = ("", "0.0.0.0", "::")  # binds that name no address to connect to
ACCEPT_BATCH = 64


def raise_open_files_limit() -> int:
    """Soft RLIMIT_NOFILE up to the hard limit; returns the soft limit in force.

    The embedded engine holds many descriptors, and each connection is one more: the usual
    soft limit of 1024 is too few for a thousand clients.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 16)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open files limit from %d to %d: %s", soft, target, exc)
    return soft


def connection_cap(limits: ClientLimits) -> int:
    """Connections per server such that accept() never meets EMFILE (waitress would spin on a
    listening socket it cannot accept from): the rest of the descriptors are left to the
    engine, the other servers and files."""
    soft = raise_open_files_limit()
    return max(16, min(limits.max_connections, (1 << 20 if soft == resource.RLIM_INFINITY else soft) // 4))


class DeadlineChannel(HTTPChannel):
    """An HTTPChannel that remembers when the request it is reading began."""

    def __init__(self, server: GuardedServer, sock: object, addr: object, adj: Adjustments,
                 map: dict | None = None) -> None:  # noqa: A002 - waitress' signature
        super().__init__(server, sock, addr, adj, map)
        self.reading_since: float | None = self.creation_time  # None: no request being read

    def received(self, data: bytes) -> bool:
        before = self.request
        if self.reading_since is None:
            self.reading_since = time.time()
        result = super().received(data)
        if self.request is None:
            self.reading_since = None  # read completely; the next request's clock starts with its first byte
        elif before is not None and self.request is not before:
            self.reading_since = time.time()  # a pipelined request began in this chunk
        return result

    def overdue(self, now: float, limits: ClientLimits) -> bool:
        """Past the header or read deadline; a request being served is the app's time, not the client's."""
        if self.reading_since is None or self.requests:
            return False
        elapsed = now - self.reading_since
        headers_done = self.request is not None and self.request.headers_finished
        return elapsed > limits.read_timeout or (not headers_done and elapsed > limits.header_timeout)

    @property
    def waiting_since(self) -> float:
        """Since when this connection has given the server nothing to do."""
        return self.reading_since if self.reading_since is not None else self.last_activity


class TlsChannel(DeadlineChannel):
    """A DeadlineChannel over a TLS socket (the server's `tls_context`; core.tls says why
    it reads and writes as it does)."""

    def __init__(self, server: Any, sock: Any, addr: object, adj: Any, map: dict | None = None) -> None:  # noqa: A002
        sock = server.tls_context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        super().__init__(server, sock, addr, adj, map)
        self.handshaken = False
        self._retry_len: int | None = None  # a write TLS must be retried with (at most) the same bytes

    def _handshake(self) -> bool:
        if self.handshaken:
            return True
        try:
            self.socket.do_handshake()
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return False
        except (ssl.SSLError, OSError):  # not TLS (a plain HTTP request), or a bad hello
            self.handle_close()
            return False
        self.handshaken = True
        return True

    def handle_read(self) -> None:
        if not self._handshake():
            return
        while True:
            try:
                data = self.socket.recv(self.adj.recv_bytes)
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return
            except (ssl.SSLError, OSError):
                self.handle_close()
                return
            if not data:
                self.connected = False  # the client closed (as waitress marks it)
                return
            self.last_activity = time.time()
            self.received(data)
            if not self.socket.pending():
                return

    def writable(self) -> bool:
        return self.handshaken and super().writable()

    def send(self, data: Any, do_close: bool = True) -> int:
        if self._retry_len is not None:
            data = data[:self._retry_len]
        try:
            sent = self.socket.send(data)
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            self._retry_len = len(data)
            return 0
        except (ssl.SSLError, OSError):
            if do_close:
                self.handle_close()
            return 0
        self._retry_len = None
        return sent


class GuardedServer(TcpWSGIServer):
    """TcpWSGIServer with read deadlines and a connection cap that evicts instead of refusing."""

    channel_class = DeadlineChannel

    def __init__(self, application: Callable, adj: Adjustments, limits: ClientLimits,
                 tls_context: ssl.SSLContext | None = None) -> None:
        self.limits = limits
        self.tls_context = tls_context
        if tls_context is not None:
            self.channel_class = TlsChannel
        self.max_connections = connection_cap(limits)
        dispatcher = ThreadedTaskDispatcher()
        dispatcher.set_thread_count(adj.threads)
        super().__init__(application, map={}, dispatcher=dispatcher, adj=adj, sockinfo=adj.listen[0])

    def readable(self) -> bool:
        now = time.time()
        if now >= self.next_channel_cleanup:
            self.next_channel_cleanup = now + self.adj.cleanup_interval
            self.maintenance(now)
        # Unlike waitress, keep accepting at the cap while a connection can make room.
        return self.accepting and (not self._full() or self._evictable() is not None)

    def handle_accept(self) -> None:
        # Up to ACCEPT_BATCH at a time, not waitress' one per loop turn: each turn walks every
        # connection, so a burst of a thousand (slow clients reconnecting) would take a
        # thousand turns while a normal client waits in the backlog behind it.
        for _ in range(ACCEPT_BATCH):
            if self._full() and self._evictable() is None:
                return  # every connection has a request in service: the rest wait in the backlog
            before = len(self.active_channels)
            super().handle_accept()
            if len(self.active_channels) == before:
                return  # the backlog is empty (or that accept failed)
            if self._live() > self.max_connections:
                self._make_room()

    def _make_room(self) -> None:
        victim = self._evictable()
        if victim is None:
            return
        log.debug("%d connections: closing %s, waiting %.1fs", len(self.active_channels), victim.addr,
                  time.time() - victim.waiting_since)
        # Closed by the loop on its next turn, not here: its descriptor number, reused at
        # once by accept(), may still have events pending in this turn's poll() result.
        victim.will_close = True

    def maintenance(self, now: float) -> None:
        super().maintenance(now)  # idle keep-alive connections past channel_timeout
        for channel in list(self.active_channels.values()):
            if channel.overdue(now, self.limits):
                channel.will_close = True  # closed by the loop on its next turn

    def _full(self) -> bool:
        return self._live() >= self.max_connections

    def _live(self) -> int:
        """Open connections, less those already told to close (they go on this loop turn)."""
        n = len(self.active_channels)
        if n < self.max_connections:
            return n  # the walk below only matters near the cap
        return n - sum(1 for c in self.active_channels.values() if c.will_close)

    def _evictable(self) -> DeadlineChannel | None:
        """The connection waiting longest with no request in service (slow or idle), if any."""
        idle = [c for c in self.active_channels.values() if not c.requests and not c.will_close]
        return min(idle, key=lambda c: c.waiting_since, default=None)


def _adjustments(host: str, port: int, threads: int, limits: ClientLimits, options: dict[str, object]) -> Adjustments:
    # poll(), not select(): the embedded engine shares this process and holds a few
    # descriptors per thread of its pools (/proc/.../task/<tid>/stat...), so descriptor
    # numbers pass select()'s limit of 1024 in a long-lived process ("filedescriptor out
    # of range in select()" stops the loop).
    options.setdefault("asyncore_use_poll", True)
    options.setdefault("channel_timeout", limits.idle_timeout)
    options.setdefault("cleanup_interval", 1)  # how often deadlines are checked, in whole seconds
    adj = Adjustments(host=host, port=port, threads=threads, ident="servelens",
                      clear_untrusted_proxy_headers=True, **options)
    if len(adj.listen) != 1:
        raise ValueError(f"{host!r} resolves to {len(adj.listen)} addresses; give one address to listen on")
    return adj


class WaitressServer:
    def __init__(self, wsgi_app: Callable, host: str, port: int, threads: int = 8, name: str = "http",
                 limits: ClientLimits | None = None, tls_context: ssl.SSLContext | None = None,
                 **options: object) -> None:
        limits = limits or LIMITS
        if tls_context is not None:
            options.setdefault("url_scheme", "https")
        self.scheme = "https" if tls_context is not None else "http"
        self._server = GuardedServer(wsgi_app, _adjustments(host, port, threads, limits, options), limits, tls_context)
        self._name = name
        self.host = host
        self.port = int(self._server.effective_port)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Where a local client reaches it (a wildcard bind is reached on loopback)."""
        host = "127.0.0.1" if self.host in WILDCARD_HOSTS else self.host
        return f"{self.scheme}://{host}:{self.port}"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._server.run, name=self._name, daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop accepting, let in-flight requests finish and their answers go out, stop.

        Sockets are closed on the server's own thread through waitress' trigger: closed
        from another thread, they break the select() that thread waits in (EBADF), and a
        response still being written is cut off.
        """
        if self._thread is None or not self._thread.is_alive():
            self._server.close()
            self._server.task_dispatcher.shutdown(cancel_pending=False, timeout=timeout)
            return
        deadline = time.monotonic() + timeout
        # The listening socket only: BaseWSGIServer.close would also close the trigger.
        self._in_loop(lambda: wasyncore.dispatcher.close(self._server), deadline)
        self._server.task_dispatcher.shutdown(cancel_pending=False, timeout=max(0.0, deadline - time.monotonic()))
        self._in_loop(self._close_when_flushed, deadline)
        while self._channels() and time.monotonic() < deadline:
            time.sleep(0.01)
        # Whatever is left (the trigger, a client that never read its answer): the map
        # empties and waitress' loop returns.
        self._in_loop(lambda: [channel.close() for channel in list(self._server._map.values())], deadline)
        self._thread.join(max(0.0, deadline - time.monotonic()))

    def _channels(self) -> list[object]:
        return [c for c in list(self._server._map.values()) if c is not self._server.trigger]

    def _close_when_flushed(self) -> None:
        for channel in self._channels():
            channel.close_when_flushed = True  # waitress closes it once its output is sent

    def _in_loop(self, action: Callable[[], object], deadline: float) -> None:
        """Run `action` on the server thread between two select() calls; wait for it."""
        done = threading.Event()

        def thunk() -> None:
            try:
                action()
            finally:
                done.set()

        self._server.trigger.pull_trigger(thunk)
        done.wait(max(0.0, deadline - time.monotonic()))
