"""Process assembly: which components each command runs, in what order they start and stop.

Start order follows the data (store -> writer/receivers -> [the demo's history, stored] ->
analytics -> dashboard -> demo traffic); stop order is the reverse, so the collector
flushes everything it acknowledged before the process exits.
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
from typing import Any

from servelens.core import allocator
from servelens.core.config import ConfigError, Settings
from servelens.core.migrate import discover, migrate, recorded
from servelens.core.retention import apply_retention
from servelens.core.serving import WILDCARD_HOSTS
from servelens.core.store import Store, is_embedded

log = logging.getLogger(__name__)


def open_store(settings: Settings, migrate_schema: bool = True) -> Store:
    """The configured store, migrated; or, with migrate_schema False (a command that only
    reads: `servelens report`, `plan`), as it is, refused with what to run when it holds
    no servelens schema or an older one (a query would fail on a missing table)."""
    try:
        store = Store(settings.store_url, settings.store.database)
        if migrate_schema:
            for m in migrate(store.client(), cluster=settings.store.cluster):
                log.info("migrated %04d_%s", m.version, m.name)
            changed = apply_retention(store.client(), settings.store.retention_days, settings.store.cluster)
            if changed:
                log.info("retention %d days set on %s", settings.store.retention_days, ", ".join(changed))
            unready = None
        else:
            unready = _unmigrated(store)
    except Exception as exc:
        hint = ""
        if is_embedded(settings.store_url):
            hint = (" (the embedded store admits one process per data directory: is `servelens up` "
                    "already running on it? Use its API, or point --clickhouse-url at a ClickHouse server)")
        raise ConfigError(f"cannot open the store {settings.store_url}: {exc}{hint}") from exc
    if unready:
        store.close()
        raise ConfigError(f"the store {settings.store_url} (database {settings.store.database}) {unready}: "
                          "run `servelens migrate` with this configuration (or start `servelens up` on it), "
                          "or point --data-dir / --clickhouse-url at the store servelens writes")
    return store


def _unmigrated(store: Store) -> str | None:
    """Why the store cannot answer reports yet, or None."""
    client = store.client()
    if not client.command("SELECT count() FROM system.tables WHERE database = currentDatabase() "
                          "AND name = 'servelens_migrations'"):
        return "holds no servelens schema"
    done = recorded(client)
    behind = [m for m in discover() if m.version not in done]
    if behind:
        return f"lacks {len(behind)} of this version's migrations (the first: {behind[0].version:04d}_{behind[0].name})"
    return None


def dashboard_url(settings: Settings, ui_port: int | None = None) -> str:
    """The dashboard's base URL as its readers reach it: alert links and the printed URL.

    public_url (else alerts.dashboard_url) when configured; otherwise http://<host>:<port>/,
    a wildcard bind named by this machine's hostname: 0.0.0.0 is no address to browse to,
    and 127.0.0.1 would only work on this machine, while the wildcard bind is for others.
    """
    if settings.link_base:
        return settings.link_base
    host = settings.host
    if host in WILDCARD_HOSTS:
        host = socket.gethostname() or "127.0.0.1"
    elif ":" in host:
        host = f"[{host}]"  # an IPv6 literal
    scheme = "https" if settings.tls_cert else "http"
    return f"{scheme}://{host}:{settings.ui_port if ui_port is None else ui_port}/"


def with_demo_defaults(settings: Settings) -> Settings:
    """--demo: price the demo's models, declare its GPU deployment, its SLOs and a spend
    budget, each unless configured."""
    from servelens.core.config import DeploymentConfig, PricingConfig, SloConfig, SpendBudget
    from servelens.demo.traffic import DEMO_CONFIG

    update: dict[str, Any] = {}
    if not settings.pricing.models:
        update["pricing"] = PricingConfig.model_validate(DEMO_CONFIG["pricing"])
    for key, model in (("deployments", DeploymentConfig), ("slos", SloConfig), ("spend_budgets", SpendBudget)):
        if not getattr(settings, key):
            update[key] = [model.model_validate(entry) for entry in DEMO_CONFIG[key]]
    return settings.model_copy(update=update)


def scheduler_role(command: str, settings: Settings) -> str | None:
    """The analytics scheduler a command runs: "runner", "standby" (the dashboard alone,
    running only while no runner is alive: analytics.leases) or None."""
    if command in ("up", "analytics"):
        return "runner"
    if command == "dashboard":
        # without it, a dashboard with no analytics process beside it never evaluates triggers
        return {"auto": "standby", "on": "runner", "off": None}[settings.dashboard.evaluate_triggers]
    return None


def _stop_on_signal() -> threading.Event:
    """An event set by SIGINT/SIGTERM, installed before anything starts so a Ctrl-C at any
    moment (even during the demo's backfill) leads to the orderly stop below."""
    stop = threading.Event()

    def handler(signum: int, _frame: Any) -> None:
        log.info("received %s, shutting down", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    return stop


def run(command: str, settings: Settings, demo: bool = False, once: bool = False) -> int:
    allocator.limit_arenas()  # before the engine and the roles start their threads
    if demo:
        settings = with_demo_defaults(settings)
    store = open_store(settings)
    if command == "migrate":
        print(f"store {store.describe()} is up to date")
        return 0
    if command == "analytics" and once:
        return _analytics_once(store, settings)
    credentials = None
    if command in ("up", "dashboard"):  # refused before anything listens (app.exposure)
        from servelens.app.exposure import ensure_admin
        from servelens.core.auth.credentials import Credentials

        credentials = Credentials(store, settings)
        try:
            ensure_admin(credentials, settings, store)
        except ConfigError:
            store.close()
            raise

    stop = _stop_on_signal()
    components: list[Any] = []  # started in order, stopped in reverse
    ports: dict[str, int] = {}
    collector = None
    try:
        if command in ("up", "collector"):
            from servelens.collector.service import Collector

            collector = Collector(settings, store, credentials)
            collector.start()
            components.append(collector)
            ports.update(collector.ports)
        traffic = None
        if demo and command == "up" and collector is not None:
            # The history is stored before the analytics and the dashboard start: their first
            # answers (a window is evaluated once; the landing page is kept warm) would
            # otherwise be of a store holding part of it, or none.
            traffic = _demo_history(settings, collector)
            components.append(traffic)
        dispatcher = None
        role = scheduler_role(command, settings)
        if role is not None:
            from servelens.analytics.alerts import Dispatcher
            from servelens.analytics.scheduler import Scheduler
            from servelens.analytics.triggers.engine import active_triggers

            # started before the scheduler and stopped after it, so its last resolves go out
            dispatcher = Dispatcher(settings, None)
            dispatcher.start()
            if role == "runner":
                # Alertmanager expires what is not re-posted: the episodes still open go out
                # again (a standby does this when it takes over).
                dispatcher.restore(active_triggers(store))
            components.append(dispatcher)
            scheduler = Scheduler(store, settings, dispatcher, standby=role == "standby")
            scheduler.start()
            components.append(scheduler)
        if command in ("up", "dashboard"):
            from servelens.dashboard.app import create_app
            from servelens.dashboard.server import DashboardServer

            stats = collector.metrics.snapshot if collector is not None else None  # shown on health
            on_demand = None
            if dispatcher is not None:
                from servelens.analytics.triggers.engine import catch_up

                def on_demand() -> dict[str, Any]:  # POST /api/v1/analytics/run's trigger windows
                    return catch_up(store, settings, dispatcher)
            server = DashboardServer(create_app(settings, store, stats, evaluate_triggers=on_demand,
                                                credentials=credentials, keep_warm=("overview",)),
                                     settings.host, settings.ui_port, tls_context=settings.tls_context(),
                                     trusted_proxy=settings.auth.trusted_proxy)
            server.start()
            components.append(server)
            ports["ui"] = server.port
            if dispatcher is not None and not dispatcher.dashboard_url:
                dispatcher.dashboard_url = dashboard_url(settings, server.port)
        print(" ".join(f"{k}={v}" for k, v in ports.items()), flush=True)
        if "ui" in ports:
            print(f"servelens dashboard: {dashboard_url(settings, ports['ui'])}", flush=True)
        if traffic is not None:
            traffic.start()
            print("demo traffic: sending to the OTLP/HTTP receiver (Ctrl-C to stop)", flush=True)
        while not stop.wait(0.5):
            pass
    finally:
        for component in reversed(components):
            try:
                component.shutdown(10.0)
            except Exception:  # noqa: BLE001 - keep stopping the rest
                log.exception("error stopping %s", type(component).__name__)
        store.close()
    return 0


def _demo_history(settings: Settings, collector: Any) -> Any:
    """The demo's traffic, its two hours of history sent (so every chart has a shape) and
    stored."""
    from servelens.core.tls import pinned_client_context
    from servelens.demo.traffic import UP_RATE_PER_S, DemoTraffic

    # the receiver speaks TLS only where a certificate is set: the demo trusts exactly that one
    tls = pinned_client_context(settings.tls_cert) if settings.tls_cert else None
    traffic = DemoTraffic(f"{'https' if tls else 'http'}://127.0.0.1:{collector.ports['otlp-http']}",
                          rate_per_s=UP_RATE_PER_S, tls=tls)
    print("demo traffic: storing two hours of history", flush=True)
    traffic.backfill(minutes=120, max_traces=None)
    if not collector.flush():
        log.warning("demo traffic: the history is not all stored yet; the first answers may miss part of it")
    return traffic


def _analytics_once(store: Store, settings: Settings) -> int:
    """`servelens analytics --once`: every report job and the due trigger windows, alerts
    delivered before the process exits."""
    from servelens.analytics.alerts import Dispatcher
    from servelens.analytics.scheduler import run_all
    from servelens.analytics.triggers.engine import catch_up

    dispatcher = Dispatcher(settings, None)
    dispatcher.start()
    try:
        result = run_all(store, settings)
        for name, job in result["jobs"].items():
            print(f"{name}: {job['rows']} rows in {job['seconds']:.3f}s")
        done = catch_up(store, settings, dispatcher)
        print(f"triggers: {len(done['windows'])} windows evaluated, {len(done['changes'])} episode changes "
              f"in {done['seconds']:.3f}s")
    finally:
        dispatcher.shutdown(30.0)
        store.close()
    return 0
