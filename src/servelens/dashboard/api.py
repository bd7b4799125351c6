"""The JSON API (SPEC 5) on the dashboard's Flask server.

Every answer under /api/ is JSON, errors included: Dash owns a catch-all route that
would otherwise answer unknown API paths with the dashboard's HTML and a 200.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Callable

from flask import Blueprint, Response, current_app, request
from werkzeug.exceptions import HTTPException

import servelens
from servelens.analytics import evaluations, scheduler
from servelens.analytics.plan import capacity, export, jobs, replay
from servelens.analytics.query import QueryError, ReportQuery, key_expr
from servelens.analytics.reports import registry as reports
from servelens.analytics.reports import series, traces_search
from servelens.analytics.triggers import engine as triggers_engine
from servelens.analytics.triggers import replay as replays
from servelens.collector.pipeline.spool import quarantine_summary
from servelens.core.auth import audit
from servelens.core.config import Settings
from servelens.core.store import StoreLike
from servelens.dashboard import access
from servelens.dashboard.guard import Guard, Refused

log = logging.getLogger(__name__)
_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    # json.dumps keeps the rows' field order (jsonify would sort keys); strict JSON, no NaN.
    return Response(json.dumps(body, allow_nan=False), status=status, headers=headers,
                    mimetype="application/json")


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return _json({"error": message}, status, headers)


def _read_bounded(limit: int) -> bytes | None:
    """The request body, or None past `limit` bytes (a chunked body declares no length)."""
    chunks, size = [], 0
    while chunk := request.stream.read(min(65536, limit + 1 - size)):
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            return None
    return b"".join(chunks)


def _triggers(store: StoreLike, params: Any, who: access.Principal) -> dict[str, Any]:
    """SPEC 5 /api/v1/triggers: episodes overlapping [since, until) (default the last 24 h);
    state=active keeps the active ones, state=all (default) every one."""
    q = ReportQuery.from_params({"since": params.get("since"), "until": params.get("until")})
    found = triggers_engine.list_triggers(store, q.since, q.until, params.get("state") or "all")
    return {"triggers": access.visible_triggers(who, found)}


def _guarded(guard: Guard, what: str, fn: Callable[..., Any], *args: Any) -> Response:
    """fn(*args) as JSON through the guard: 400 for a bad parameter, 500/503/504 for a
    call that produced nothing (never the internal exception's text)."""
    try:
        return _json(guard.call(what, fn, *args))
    except QueryError as exc:
        return _error(400, str(exc))
    except Refused as exc:
        return _error(exc.status, exc.message, {"Retry-After": "1"} if exc.status == 503 else None)


def blueprint(settings: Settings, store: StoreLike, collector_stats: Callable[[], dict[str, float]] | None = None,
              guard: Guard | None = None,
              evaluate_triggers: Callable[[], dict[str, Any]] | None = None,
              plan_jobs: jobs.Jobs | None = None) -> Blueprint:
    """A fresh blueprint bound to settings and store (one per app, so tests build many).

    `collector_stats`: the in-process collector's counters (all-in-one mode), shown on health.
    `guard`: what report calls run under (the app's, shared with its pages).
    `evaluate_triggers`: evaluates the trigger windows due, announcing through the process's
    alert dispatcher (analytics.triggers.engine.catch_up); None where this process has no
    trigger role (dashboard.evaluate_triggers: off), and analytics/run then says so.
    `plan_jobs`: where replays run (the app's, shared with the Plan page: one at a time).
    """
    guard = guard or Guard()
    api = Blueprint("servelens_api", __name__, url_prefix="/api")

    @api.get("/v1/health")
    def health() -> Any:
        body: dict[str, Any] = {"status": "ok", "store": store.describe(), "version": servelens.__version__,
                                "ingest": quarantine_summary(settings.spool_dir)}
        if collector_stats is not None:
            body["collector"] = collector_stats()
        try:
            store.client().command("SELECT 1")
        except Exception as exc:  # noqa: BLE001 - any store failure means degraded
            log.warning("health check: store unreachable: %s", exc)
            return _json({**body, "status": "degraded", "error": str(exc)}, 503)
        return _json(body)

    @api.post("/v1/analytics/run")
    def analytics_run() -> Any:
        audit.record(store, "analytics_run", access.principal().name, remote=request.remote_addr or "")
        result = scheduler.run_all(store, settings)
        if evaluate_triggers is None:
            result["jobs"]["triggers"] = {"rows": 0, "seconds": 0.0,
                                          "skipped": "this process evaluates no triggers (dashboard.evaluate_triggers)"}
        else:
            done = evaluate_triggers()
            result["jobs"]["triggers"] = {"rows": len(done["changes"]), "seconds": done["seconds"],
                                          "windows": len(done["windows"]), "changes": done["changes"]}
        return _json(result)

    @api.get("/v1/trigger-replays")
    def trigger_replays() -> Any:
        return _json({"replays": replays.listing(store)})

    @api.get("/v1/trigger-replays/<replay_id>")
    def trigger_replay(replay_id: str) -> Any:
        found = replays.load(store, replay_id)
        return _json(found) if found is not None else _error(404, f"no replay {replay_id!r}")

    @api.get("/v1/plan/capacity")
    def plan_capacity() -> Any:
        return _guarded(guard, "plan capacity", capacity.plan, store, settings, request.args.to_dict())

    plan_jobs = plan_jobs or jobs.Jobs()

    @api.route("/v1/plan/replay", methods=["GET", "POST"])
    def plan_replay() -> Any:
        """Starts Tier B on the deployment's stored trace: {"job": id}, polled at plan/jobs/<id>."""
        params = request.args.to_dict()
        try:
            replay.check(params, settings)
            job = plan_jobs.start("replay", params, lambda progress: replay.replay(store, settings, params,
                                                                                   progress=progress))
        except QueryError as exc:
            return _error(400, str(exc))
        except jobs.Busy as exc:
            return _error(429, str(exc), {"Retry-After": "10"})
        return _json({"job": job.id, "status_url": f"/api/v1/plan/jobs/{job.id}"}, 202)

    @api.get("/v1/plan/export")
    def plan_export() -> Any:
        """The deployment's measured trace as CSV (format=servelens|vidur), a download."""
        try:
            name, text = guard.call("plan export", export.export, store, request.args.to_dict(),
                                    settings.plan.replay_max_requests)
        except QueryError as exc:
            return _error(400, str(exc))
        except Refused as exc:
            return _error(exc.status, exc.message)
        return Response(text, mimetype="text/csv", headers={"Content-Disposition": f'attachment; filename="{name}"'})

    @api.get("/v1/plan/jobs/<job_id>")
    def plan_job(job_id: str) -> Any:
        job = plan_jobs.get(job_id)
        return _json(job.as_dict()) if job is not None else _error(404, f"no job {job_id!r} (finished jobs are "
                                                                         "kept for a while, not across restarts)")

    @api.get("/v1/reports/<name>")
    def report(name: str) -> Any:
        if name not in reports.REPORTS:
            return _error(404, f"unknown report {name!r}; available: {sorted(reports.REPORTS)}")
        return _guarded(guard, f"report {name}", reports.run, name, store, settings, request.args.to_dict())

    @api.get("/v1/series/<metric>")
    def metric_series(metric: str) -> Any:
        if metric not in series.METRICS:
            return _error(404, f"unknown metric {metric!r}; available: {sorted(series.METRICS)}")
        return _guarded(guard, f"series {metric}", series.run, metric, store, settings, request.args.to_dict())

    @api.post("/v1/evaluations")
    def post_evaluations() -> Any:
        # JSON only: a cross-site HTML form can send text/plain without a preflight
        if request.mimetype != "application/json":
            return _error(415, "send the results as JSON (Content-Type: application/json)")
        who = access.principal()
        owner = who.tenants[0] if who.role == "ingest" and who.tenants else None
        limit = settings.collector.max_request_bytes
        body = _read_bounded(limit)
        if body is None:
            return _error(413, f"body over {limit} bytes")
        try:
            tenant = key_expr("tenant", settings.attributes) if owner is not None else None
            return _json({"accepted": evaluations.ingest(store, body, tenant, owner)})
        except evaluations.Rejected as exc:
            return _json(exc.body, exc.status)

    @api.get("/v1/triggers")
    def triggers() -> Any:
        return _guarded(guard, "triggers", _triggers, store, request.args.to_dict(), access.principal())

    @api.get("/v1/traces")
    def traces() -> Any:
        return _guarded(guard, "trace search", traces_search.search, store, settings, request.args.to_dict())

    @api.get("/v1/traces/<trace_id>")
    def trace(trace_id: str) -> Any:
        try:
            trace_id = traces_search.parse_trace_id(trace_id)
        except QueryError as exc:
            return _error(400, str(exc))
        found = _guarded(guard, "trace lookup", traces_search.get_trace, store, settings, trace_id)
        if found.status_code == 200 and not access.may_see_trace(access.principal(), found.get_json()):
            return _error(404, f"no trace {trace_id}")
        return found

    @api.route("/<path:rest>", methods=_METHODS)
    def not_found(rest: str) -> Any:
        # This route also catches a known path with the wrong method: answer 405 then.
        adapter = current_app.url_map.bind_to_environ(request.environ)
        allowed = [m for m in _METHODS
                   if adapter.match(request.path, method=m, return_rule=True)[0].endpoint != request.endpoint]
        if allowed:
            return _error(405, f"{request.method} not allowed on {request.path}; use {', '.join(allowed)}",
                          {"Allow": ", ".join(allowed)})
        return _error(404, f"no API endpoint {request.method} {request.path}")

    @api.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> Any:
        return _error(exc.code or 500, exc.description or exc.name)

    @api.errorhandler(Exception)
    def internal_error(exc: Exception) -> Any:
        log.exception("API request %s %s failed", request.method, request.path)
        return _error(500, f"internal error: {type(exc).__name__}")

    return api
