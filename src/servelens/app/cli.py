"""The `servelens` command (SPEC 1): up, migrate, collector, analytics, dashboard, report, prices, alerts, spool,
users, tokens."""

from __future__ import annotations

import argparse
import csv
import io
import json
import logging
import os
import sys
from datetime import datetime
from pathlib import Path
from typing import Any, Sequence

from servelens import __version__
from servelens.core.config import ConfigError, Settings, load
from servelens.core.store import StoreLike

REPORT_FORMATS = ("table", "json", "csv")
PRICES_FORMATS = ("table", "json")


def _common(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("common options")
    g.add_argument("--config", metavar="FILE", help="YAML config (default ./servelens.yaml if present)")
    g.add_argument("--clickhouse-url", metavar="URL", help="chdb://DIR (default chdb://<data-dir>) or http(s)://…")
    g.add_argument("--data-dir", metavar="DIR", help="where the embedded store and the spool live")
    g.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    g.add_argument("--otlp-grpc-port", type=int, metavar="PORT", help="OTLP/gRPC port (default 4317, 0 = any)")
    g.add_argument("--otlp-http-port", type=int, metavar="PORT", help="OTLP/HTTP port (default 4318, 0 = any)")
    g.add_argument("--ui-port", type=int, metavar="PORT", help="dashboard + API port (default 8050, 0 = any)")
    g.add_argument("--public-url", metavar="URL", help="the dashboard's URL as its readers reach it (alert links)")
    g.add_argument("--tls-cert", metavar="PEM", help="serve the dashboard, OTLP/HTTP and OTLP/gRPC over TLS (with --tls-key)")
    g.add_argument("--tls-key", metavar="PEM", help="the private key of --tls-cert")
    g.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="servelens", description="Observability and FinOps analytics for AI serving.")
    parser.add_argument("--version", action="version", version=f"servelens {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    up = sub.add_parser("up", help="all-in-one: migrate, receivers, analytics, dashboard")
    up.add_argument("--demo", action="store_true", help="also send realistic demo traffic to the receivers")
    _common(up)
    migrate_cmd = sub.add_parser("migrate", help="apply migrations/ (safe to re-run)")
    migrate_cmd.add_argument("--print-ddl", action="store_true",
                             help="print the DDL the migrations run (for store.cluster when set) and exit; needs no store")
    _common(migrate_cmd)
    for name, text in (("collector", "OTLP receivers only"),
                       ("dashboard", "dashboard + JSON API only")):
        _common(sub.add_parser(name, help=text))
    analytics = sub.add_parser("analytics", help="run the analytics jobs on a schedule")
    analytics.add_argument("--once", action="store_true", help="run every job once and exit")
    _common(analytics)
    report = sub.add_parser("report", help="print one report")
    report.add_argument("name", help="overview, latency, cost, …")
    report.add_argument("--since", help="ISO-8601 start (default: until - 24h)")
    report.add_argument("--until", help="ISO-8601 end (default: now)")
    report.add_argument("--by", help="grouping key (model, service, deployment, tenant, feature, team, …)")
    for key in ("service", "deployment", "model", "tenant", "feature"):
        report.add_argument(f"--{key}", help=f"only this {key}")
    report.add_argument("--format", choices=REPORT_FORMATS, default="table")
    report.add_argument("--server", metavar="URL", help="ask a running dashboard's API instead of opening the store "
                                                         "(with a token: --token or SERVELENS_TOKEN)")
    report.add_argument("--token", help="an API token for --server (default: $SERVELENS_TOKEN)")
    report.add_argument("--ca-file", metavar="PEM", help="--server over https with a certificate this CA signed")
    _common(report)
    prices = sub.add_parser("prices", help="the price catalog: the config's models, and how given models resolve")
    prices.add_argument("--models", metavar="M1,M2", help="models to resolve (a provider prefix is allowed: openai/gpt-4o)")
    prices.add_argument("--provider", help="the provider they are sent to, as spans name it (gen_ai.provider.name)")
    prices.add_argument("--format", choices=PRICES_FORMATS, default="table")
    _common(prices)
    alerts = sub.add_parser("alerts", help="alert sinks (alerts.sinks)")
    alerts_sub = alerts.add_subparsers(dest="alerts_command", required=True, metavar="ACTION")
    _common(alerts_sub.add_parser("test", help="send a test alert to every configured sink now"))
    triggers = sub.add_parser("triggers", help="re-evaluation triggers: replay history with the current config")
    triggers_sub = triggers.add_subparsers(dest="triggers_command", required=True, metavar="ACTION")
    replay = triggers_sub.add_parser(
        "replay", help="evaluate past windows one by one into a separate result set (no alerts sent)")
    replay.add_argument("--since", required=True, help="ISO-8601 start")
    replay.add_argument("--until", help="ISO-8601 end (default: now)")
    replay.add_argument("--kind", action="append", metavar="KIND", help="only this kind (repeatable)")
    replay.add_argument("--format", choices=("table", "json"), default="table")
    _common(replay)
    replays = triggers_sub.add_parser("replays", help="list stored replays, or show one")
    replays.add_argument("id", nargs="?", help="one replay's id")
    replays.add_argument("--format", choices=("table", "json"), default="table")
    _common(replays)
    plan = sub.add_parser("plan", help="capacity what-if from measured traffic")
    plan_sub = plan.add_subparsers(dest="plan_command", required=True, metavar="ACTION")
    cap = plan_sub.add_parser("capacity", help="replicas a p99 target needs; p99 and idle cost per replica count")
    cap.add_argument("--deployment", required=True)
    cap.add_argument("--target", help="p99_queue_ms|p99_ttft_ms|p99_latency_ms:N")
    for name in ("traffic_x", "input_x", "output_x", "gpu_hourly_usd", "replicas"):
        cap.add_argument(f"--{name.replace('_', '-')}", dest=name, help=f"what-if: {name}")
    cap.add_argument("--since", help="ISO-8601 start of the measured window (default: until - 7d)")
    cap.add_argument("--until", help="ISO-8601 end (default: now)")
    cap.add_argument("--format", choices=("table", "json"), default="table")
    _common(cap)
    rep = plan_sub.add_parser("replay", help="Tier B: replay the stored trace through a batching model, with its "
                                             "backtest and a what-if (replicas, autoscaling, traffic)")
    rep.add_argument("--deployment", required=True)
    for name in ("replicas", "traffic_x", "gpu_hourly_usd", "queue_budget_ms"):
        rep.add_argument(f"--{name.replace('_', '-')}", dest=name, help=f"what-if: {name}")
    rep.add_argument("--autoscaling", help="on (the config's plan.autoscaling), or name=value,... over it "
                                           "(min_replicas, max_replicas, target_utilization, scale_up_lag_s, "
                                           "cold_start_s, ...)")
    rep.add_argument("--since", help="ISO-8601 start of the replayed window (default: until - 7d)")
    rep.add_argument("--until", help="ISO-8601 end (default: now)")
    rep.add_argument("--format", choices=("table", "json"), default="table")
    _common(rep)
    exp = plan_sub.add_parser("export", help="the measured trace as CSV (servelens, or Vidur's trace-replay format)")
    exp.add_argument("--deployment", required=True)
    exp.add_argument("--format", choices=("servelens", "vidur"), default="servelens")
    exp.add_argument("--since", help="ISO-8601 start (default: until - 7d)")
    exp.add_argument("--until", help="ISO-8601 end (default: now)")
    exp.add_argument("--output", "-o", help="file to write (default: stdout)")
    _common(exp)
    spool = sub.add_parser("spool", help="batches the collector set aside (quarantine): list, show, release")
    spool_sub = spool.add_subparsers(dest="spool_command", required=True, metavar="ACTION")
    listing = spool_sub.add_parser("list", help="what waits in the spool and what was quarantined, with why")
    listing.add_argument("--json", action="store_true")
    _common(listing)
    show = spool_sub.add_parser("show", help="the rows of one quarantined batch")
    show.add_argument("id")
    _common(show)
    release = spool_sub.add_parser("release", help="put quarantined batches back to be inserted again")
    release.add_argument("id", nargs="?", help="one batch (default: all)")
    _common(release)
    _access_commands(sub)
    return parser


def _access_commands(sub: Any) -> None:
    """`servelens users` and `servelens tokens` (app.access_cli)."""
    users = sub.add_parser("users", help="dashboard users: add, list, remove, hash a password for the config")
    users_sub = users.add_subparsers(dest="users_command", required=True, metavar="ACTION")
    add = users_sub.add_parser("add", help="add a user, or set an existing one's password and role")
    add.add_argument("name")
    add.add_argument("--role", required=True, choices=("admin", "viewer", "tenant"))
    add.add_argument("--tenant", action="append", metavar="TENANT", help="role tenant: a tenant it reads (repeatable)")
    add.add_argument("--password-stdin", action="store_true", help="read the password from stdin's first line")
    _common(add)
    listing = users_sub.add_parser("list", help="every user, from the config and the store")
    listing.add_argument("--json", action="store_true")
    _common(listing)
    remove = users_sub.add_parser("remove", help="remove a user added with `users add`")
    remove.add_argument("name")
    _common(remove)
    hashing = users_sub.add_parser("hash", help="print an argon2id hash of a password, for auth.users")
    hashing.add_argument("--password-stdin", action="store_true", help="read the password from stdin's first line")
    hashing.add_argument("--log-level", default="WARNING", help=argparse.SUPPRESS)
    tokens = sub.add_parser("tokens", help="API and collector tokens: create, list, revoke")
    tokens_sub = tokens.add_subparsers(dest="tokens_command", required=True, metavar="ACTION")
    create = tokens_sub.add_parser("create", help="a new bearer token, printed once")
    create.add_argument("--role", required=True, choices=("admin", "viewer", "tenant", "ingest"),
                        help="ingest: writes telemetry and evaluations (for --tenant, or the operator's without)")
    create.add_argument("--tenant", action="append", metavar="TENANT", help="role tenant or ingest: its tenant")
    create.add_argument("--name", help="what it is for (shown in listings)")
    create.add_argument("--expires", metavar="WHEN", help="a duration (90d) or an ISO-8601 time; default never")
    _common(create)
    tlist = tokens_sub.add_parser("list", help="every token (never the token itself)")
    tlist.add_argument("--json", action="store_true")
    _common(tlist)
    revoke = tokens_sub.add_parser("revoke", help="revoke a token by its id")
    revoke.add_argument("id")
    _common(revoke)


# Commands that evaluate triggers: their settings are validated with every kind's section.
TRIGGER_COMMANDS = ("up", "analytics", "dashboard", "triggers")


def settings_from(args: argparse.Namespace) -> Settings:
    return load(args.config, clickhouse_url=args.clickhouse_url, data_dir=args.data_dir, host=args.host,
                otlp_grpc_port=args.otlp_grpc_port, otlp_http_port=args.otlp_http_port, ui_port=args.ui_port,
                public_url=args.public_url, tls_cert=args.tls_cert, tls_key=args.tls_key)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "users" and args.users_command == "hash":
            from servelens.app import access_cli

            return access_cli.hash_command(args.password_stdin)
        if args.command in TRIGGER_COMMANDS:
            # Every trigger kind registered first, so a bad key under triggers: fails now, naming it.
            from servelens.analytics.triggers import detectors  # noqa: F401
        settings = settings_from(args)
        if args.command == "report":
            return _report(args, settings)
        if args.command == "prices":
            print(format_prices(prices_document(settings, args.models, args.provider), args.format))
            return 0
        if args.command == "alerts":
            return _alerts_test(settings)
        if args.command == "migrate" and args.print_ddl:
            from servelens.core.migrate import ddl_script

            print(ddl_script(settings.store.cluster, settings.store.database), end="")
            return 0
        if args.command == "plan":
            return _plan(args, settings)
        if args.command == "triggers":
            return _triggers(args, settings)
        if args.command in ("users", "tokens"):
            from servelens.app import access_cli

            return access_cli.run(args, settings)
        if args.command == "spool":
            from servelens.app import spool_cli

            return spool_cli.run(args.spool_command, settings, getattr(args, "id", None), getattr(args, "json", False))
        from servelens.app import runtime

        return runtime.run(args.command, settings, demo=getattr(args, "demo", False), once=getattr(args, "once", False))
    except ConfigError as exc:
        print(f"servelens: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _report(args: argparse.Namespace, settings: Settings) -> int:
    from servelens.analytics.reports import registry as reports

    params = {k: getattr(args, k) for k in ("since", "until", "by", "service", "deployment", "model", "tenant", "feature")}
    if args.server:
        from servelens.app.api_client import ApiError, get_json

        try:
            document = get_json(args.server, f"/api/v1/reports/{args.name}", params,
                                args.token or os.environ.get("SERVELENS_TOKEN"), args.ca_file)
        except ApiError as exc:
            print(f"servelens: {exc}", file=sys.stderr)
            return 2
        print(format_report(document, args.format))
        return 0
    document = _on_store(settings, lambda store: reports.run(args.name, store, settings, params))
    if document is None:
        return 2
    print(format_report(document, args.format))
    return 0


def _on_store(settings: Settings, compute: Any, migrate_schema: bool = False) -> Any:
    """compute(store) on the configured store, closed after; a refused query is printed
    (and None returned: the command exits 2)."""
    from servelens.analytics.query import QueryError
    from servelens.app.runtime import open_store

    store = open_store(settings, migrate_schema=migrate_schema)
    try:
        return compute(store)
    except QueryError as exc:
        print(f"servelens: {exc}", file=sys.stderr)
        return None
    finally:
        store.close()


def _triggers(args: argparse.Namespace, settings: Settings) -> int:
    """`servelens triggers replay|replays`: analytics.triggers.replay."""
    from servelens.analytics.query import QueryError, parse_time
    from servelens.analytics.triggers import replay as replays
    from servelens.analytics.triggers.base import KINDS

    unknown = sorted(set(args.kind or ()) - set(KINDS)) if args.triggers_command == "replay" else []
    if unknown:
        print(f"servelens: unknown trigger kind(s) {unknown}; kinds: {', '.join(KINDS)}", file=sys.stderr)
        return 2

    def progress(end: datetime, found: int) -> None:
        print(f"  window ending {end.isoformat()}: {found} episodes so far", file=sys.stderr, flush=True)

    def compute(store: StoreLike) -> Any:
        if args.triggers_command == "replays":
            found = replays.load(store, args.id) if args.id else {"replays": replays.listing(store)}
            if found is None:
                raise QueryError(f"no replay {args.id!r}")
            return found
        since = parse_time(args.since, "since")
        until = parse_time(args.until, "until") or datetime.now(since.tzinfo)
        return replays.replay(store, settings, since, until, args.kind, progress=progress)

    # replay writes; a listing on a fresh store is empty, not an error
    document = _on_store(settings, compute, migrate_schema=True)
    if document is None:
        return 2
    print(json.dumps(document, indent=2) if args.format == "json" else format_replay(document))
    return 0


def _plan(args: argparse.Namespace, settings: Settings) -> int:
    """`servelens plan capacity`: analytics.plan.capacity, as the API answers it."""
    from servelens.analytics.plan import capacity

    if args.plan_command == "replay":
        return _plan_replay(args, settings)
    if args.plan_command == "export":
        from servelens.analytics.plan import export

        params = {"deployment": args.deployment, "format": args.format, "since": args.since, "until": args.until}
        found = _on_store(settings, lambda store: export.export(store, params, settings.plan.replay_max_requests))
        if found is None:
            return 2
        if args.output:
            Path(args.output).write_text(found[1])
        else:
            sys.stdout.write(found[1])
        return 0

    params = {k: getattr(args, k) for k in ("deployment", "target", "traffic_x", "input_x", "output_x",
                                            "gpu_hourly_usd", "replicas", "since", "until")}
    document = _on_store(settings, lambda store: capacity.plan(store, settings, params))
    if document is None:
        return 2
    if args.format == "json":
        print(json.dumps(document, indent=2))
        return 0
    m, b = document["measured"], document["backtest"]
    print(f"{document['deployment']}: peak hour {m['peak_hour']}, {m['arrival_rps']:.2f} req/s, "
          f"{m['replicas']} replicas x {m['concurrency_per_replica']} sequences; "
          f"replicas needed: {document['replicas_needed'] if document['target'] else '(no --target)'}")
    print("\n".join(_table(document["at"])))
    print(f"backtest (p99 queue wait, peak hour): model {b['p99_queue_ms_model']} ms, observed "
          f"{b['p99_queue_ms_observed']} ms" + (" (fitted)" if b["fitted"] else ""))
    for note in document["notes"]:
        print(f"note: {note}")
    return 0


def _plan_replay(args: argparse.Namespace, settings: Settings) -> int:
    """`servelens plan replay`: analytics.plan.replay with a progress bar on stderr."""
    from servelens.analytics.plan import replay

    params = {k: getattr(args, k) for k in ("deployment", "replicas", "traffic_x", "gpu_hourly_usd",
                                            "queue_budget_ms", "autoscaling", "since", "until")}
    bar = _ProgressBar(sys.stderr)
    document = _on_store(settings, lambda store: replay.replay(store, settings, params, progress=bar))
    bar.close()
    if document is None:
        return 2
    if args.format == "json":
        print(json.dumps(document, indent=2))
        return 0
    b, fit = document["backtest"], document["server"]
    print(f"{document['deployment']}: {document['requests']:,} requests {document['since']} .. {document['until']}, "
          f"{document['measured']['replicas']} replicas")
    print(f"step time = {_cell(fit['a_s'])} s + {_cell(fit['b_s_per_token'])} s/prefill token + "
          f"{_cell(fit['c_s_per_sequence'])} s/decode sequence (R² prefill {_cell(fit['r2_prefill'])}, decode "
          f"{_cell(fit['r2_decode'])}; {fit['n']:,} observations)")
    rows = [{"p99": name.removesuffix("_p99_s"), "observed_s": b["observed"][name], "replayed_s": b["simulated"][name],
             "error": b["errors"][name]} for name in b["observed"]]
    print("\n".join(_table(rows)))
    print(f"backtest: {b['verdict']}")
    if "result" in document:
        r, m = document["result"], document["at_measured"]
        print(f"what-if {document['whatif']}:")
        print("\n".join(_table([{"run": "measured", **_replay_row(m)}, {"run": "what-if", **_replay_row(r)}])))
    for note in document["notes"]:
        print(f"note: {note}")
    return 0


def _replay_row(r: dict[str, Any]) -> dict[str, Any]:
    return {"queue_p99_s": r["queue_wait_p99_s"], "ttft_p99_s": r["ttft_p99_s"], "latency_p99_s": r["latency_p99_s"],
            "gpu_hours": r["gpu_hours_provisioned"], "busy_share": r["busy_share"], "cost_usd": r["cost_usd"],
            "idle_cost_usd": r["idle_cost_usd"], "over_budget": r["queued_over_budget"]}


class _ProgressBar:
    """A one-line bar redrawn in place on a terminal; on a pipe, a line per tenth."""

    def __init__(self, stream: Any, width: int = 30) -> None:
        self._stream, self._width, self._shown = stream, width, -1
        self._tty = hasattr(stream, "isatty") and stream.isatty()

    def __call__(self, fraction: float) -> None:
        step = int(fraction * (100 if self._tty else 10))
        if step == self._shown:
            return
        self._shown = step
        done = int(fraction * self._width)
        line = f"replay [{'#' * done}{'.' * (self._width - done)}] {fraction:4.0%}"
        self._stream.write(f"\r{line}" if self._tty else f"{line}\n")
        self._stream.flush()

    def close(self) -> None:
        if self._tty and self._shown >= 0:
            self._stream.write("\n")


def format_replay(document: dict[str, Any]) -> str:
    """A replay (or the list of replays) as aligned text."""
    if "replays" in document:
        return "\n".join(_table(document["replays"])) if document["replays"] else "no replays stored"
    lines = [f"replay {document['replay']}: {document['windows']} windows, {document['since']} .. {document['until']}, "
             f"{len(document['triggers'])} episodes (stored; no alert was sent)"]
    rows = [{"kind": t["kind"], "subject": ",".join(f"{k}={v}" for k, v in t["subject"].items()),
             "severity": t["severity"], "started_at": t["started_at"], "resolved_at": t["resolved_at"] or "(open)",
             "firing_windows": t["firing_windows"], "summary": t["summary"]} for t in document["triggers"]]
    return "\n".join(lines + (_table(rows) if rows else []))


def prices_document(settings: Settings, models: str | None, provider: str | None) -> dict[str, Any]:
    """The config's price entries, and how each of `models` (comma-separated) resolves now."""
    from servelens.analytics.pricing import Catalog

    catalog = Catalog.of(settings.pricing.models, settings.pricing.catalog)
    names = [m.strip() for m in (models or "").split(",") if m.strip()]
    return {"catalog": catalog.genai.version if catalog.genai else "none",
            "config": catalog.describe_config(),
            "models": [catalog.describe(name, provider or "") for name in names]}


def format_prices(document: dict[str, Any], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(document, indent=2, default=_iso)
    lines = [f"pricing.models ({len(document['config'])} entries), then {document['catalog']} for the rest"]
    lines += _table(document["config"]) if document["config"] else ["(no entries)"]
    if document["models"]:
        lines += ["", "resolved now:", *_table(document["models"])]
    return "\n".join(lines)


def _iso(value: Any) -> str:
    from servelens.analytics.query import iso

    if isinstance(value, datetime):
        return iso(value)
    raise TypeError(f"not JSON serializable: {value!r}")


def _alerts_test(settings: Settings) -> int:
    """One line per sink; exit 1 when any failed, or when there is nothing to test."""
    from servelens.analytics.alerts import send_test
    from servelens.app.runtime import dashboard_url

    if not settings.alerts.sinks:
        print("servelens: no alert sinks configured (alerts.sinks)", file=sys.stderr)
        return 1
    results = send_test(settings, dashboard_url=dashboard_url(settings))
    for name, result in results.items():
        print(f"{name}: {result}")
    return 0 if all(r == "ok" for r in results.values()) else 1


def format_report(document: dict[str, Any], fmt: str) -> str:
    rows = document["rows"]
    if fmt == "json":
        return json.dumps(document, indent=2)
    columns = list(rows[0]) if rows else []
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return out.getvalue().rstrip("\n")
    header = f"{document['report']}  {document['since']} .. {document['until']}"
    if not rows:
        return f"{header}\n(no rows)"
    return "\n".join([header, *_table(rows)])


def _table(rows: list[dict[str, Any]]) -> list[str]:
    """Aligned text lines: a header, a rule, one line per row (numbers to the right)."""
    columns = list(rows[0])
    cells = [[_cell(row[c]) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.rjust(w) if _numeric(v) else v.ljust(w) for v, w in zip(r, widths)) for r in cells]
    return lines


def _cell(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, datetime):
        return _iso(value)
    if isinstance(value, float):
        return f"{value:.6g}" if abs(value) < 1e6 else f"{value:,.0f}"
    return str(value)


def _numeric(text: str) -> bool:
    try:
        float(text.replace(",", ""))
    except ValueError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
