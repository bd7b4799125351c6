"""A WSGI app served by waitress on a background thread, with a prompt, clean stop.

Shared by the OTLP/HTTP receiver and the dashboard. Port 0 picks a free port.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from waitress import wasyncore
from waitress.server import create_server


class WaitressServer:
    def __init__(self, wsgi_app: Callable, host: str, port: int, threads: int = 8, name: str = "http",
                 **options: object) -> None:
        # poll(), not select(): the embedded engine shares this process and holds a few
        # descriptors per thread of its pools (/proc/.../task/<tid>/stat...), so descriptor
        # numbers pass select()'s limit of 1024 in a long-lived process ("filedescriptor out
        # of range in select()" stops the loop).
        options.setdefault("asyncore_use_poll", True)
        self._server = create_server(wsgi_app, host=host, port=port, threads=threads,
                                     ident="servelens", clear_untrusted_proxy_headers=True, **options)
        self._name = name
        self.host = host
        self.port = int(self._server.effective_port)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Where a local client reaches it (a wildcard bind is reached on loopback)."""
        host = "127.0.0.1" if self.host in ("", "0.0.0.0", "::") else self.host
        return f"http://{host}:{self.port}"

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
