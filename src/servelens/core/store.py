"""The one way to reach ClickHouse: clickhouse-connect over chDB (embedded) or HTTP(S).

`chdb://path` opens the in-process engine on that directory (one process per directory);
`http(s)://user:pass@host:8123` a server. Everything above this module speaks the same
SQL to either.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Protocol
from urllib.parse import urlparse

import clickhouse_connect
from clickhouse_connect.driver.client import Client


def _chdb_dsn(url: str) -> str:
    # chdb://relative/dir is a path, not host+database: hand clickhouse-connect the
    # absolute chdb:///abs/dir form so it never reads the first segment as a host.
    raw = url[len("chdb://"):]
    path = Path(raw).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    return f"chdb://{path}"


def is_embedded(url: str) -> bool:
    return url.startswith("chdb://")


def connect(url: str, database: str | None = None) -> Client:
    """A new client on `url`; with `database`, it is created if missing and selected."""
    if is_embedded(url):
        dsn = _chdb_dsn(url)
        if database:
            clickhouse_connect.get_client(dsn=dsn).command(f"CREATE DATABASE IF NOT EXISTS `{database}`")
        return clickhouse_connect.get_client(dsn=dsn, database=database)
    parsed = urlparse(url)
    if database:
        bootstrap = clickhouse_connect.get_client(dsn=url)
        bootstrap.command(f"CREATE DATABASE IF NOT EXISTS `{database}`")
        bootstrap.close()
    return clickhouse_connect.get_client(dsn=url, database=database or (parsed.path.strip("/") or None))


class StoreLike(Protocol):
    """What the layers above need of a store (Store is the one implementation): a client
    for the calling thread, and the URL it is on."""

    url: str

    def client(self) -> Client: ...


class Store:
    """Per-thread clients on one URL/database (a client is not shared across threads)."""

    def __init__(self, url: str, database: str) -> None:
        self.url = url
        self.database = database
        self._local = threading.local()
        self._lock = threading.Lock()
        self._clients: list[Client] = []
        self._ensure_database()

    def _ensure_database(self) -> None:
        self.client()  # connect() creates the database

    def client(self) -> Client:
        client = getattr(self._local, "client", None)
        if client is None:
            client = connect(self.url, self.database)
            self._local.client = client
            with self._lock:
                self._clients.append(client)
        return client

    def describe(self) -> str:
        kind = "embedded chDB" if is_embedded(self.url) else "ClickHouse server"
        return f"{kind} {self.url.split('@')[-1]} database={self.database}"

    def close(self) -> None:
        with self._lock:
            for client in self._clients:
                try:
                    client.close()
                except Exception:  # noqa: BLE001 - closing is best effort
                    pass
            self._clients.clear()
        self._local = threading.local()
