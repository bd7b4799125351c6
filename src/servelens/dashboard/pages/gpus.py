"""GPUs: utilization per deployment and what its idle part costs, then every GPU.

A tenant viewer reads their share instead (SPEC 9): what their requests were allocated of
each self-hosted deployment's GPU cost, busy and fully loaded, from the cost report filtered
to their tenant on the server. The deployments' utilization, GPUs and idle cost are the
fleet's (other tenants' load), so they are not on their page."""

from __future__ import annotations

from typing import Any

import dash
from dash import html

from servelens.dashboard import access, data, timecharts
from servelens.dashboard.components import (LOADING, NULL, card, empty, integer, page, panel, pct, register_refresh,
                                            search_box, show, table, top_table, updated_line, usd)
from servelens.dashboard.timecharts import Chart, Line

dash.register_page(__name__, path="/gpus", name="GPUs", title="GPUs · servelens")


def _ratio(value: float) -> str:
    return f"{value:.2f}×"


# What each utilization was measured by (analytics.sources.gpus): the graphics engine's
# active time where a GPU reports it, DCGM_FI_DEV_GPU_UTIL otherwise (gpus.busy_metric).
BUSY_METRICS = {"gr_engine_active": "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gpu_util": "DCGM_FI_DEV_GPU_UTIL"}


def busy_note(metric: str | None) -> str:
    """The utilization card's note: which metric the mean is of ("mixed": its GPUs differ)."""
    if metric == "mixed":
        return "mean over samples; metric per GPU below"
    return f"mean of {BUSY_METRICS.get(metric, metric)}" if metric else "mean over samples"


GPU_COLUMNS = (
    ("deployment", "Deployment", str), ("host", "Host", str), ("gpu", "GPU", str), ("model_name", "Model", str),
    ("busy_metric", "Busy metric", str),
    ("gpu_util_mean", "Util mean", pct), ("gpu_util_p95", "Util p95", pct), ("peak_to_average", "Peak/avg", _ratio),
    ("provisioned_cost_usd", "Provisioned", usd), ("busy_cost_usd", "Busy", usd), ("idle_cost_usd", "Idle", usd),
)


def deployment_panel(index: int, row: dict[str, Any]) -> html.Section:
    """One deployment: its GPUs, utilization and cost split, idle cost in red."""
    name = row.get("deployment") or "(none)"
    provisioned, idle = row.get("provisioned_cost_usd"), row.get("idle_cost_usd")
    idle_hint = f"{idle / provisioned:.0%} of provisioned" if idle is not None and provisioned else "not utilized"
    key = f"gpus-d{index}"  # by position: deployment names may hold characters ids cannot
    return html.Section(className="panel gap-below", children=[
        html.H2(name, id=f"{key}-name"),
        html.Div(className="cards", children=[
            card(f"{key}-gpus", "GPUs", show(row.get("gpus"), integer), "seen or configured"),
            card(f"{key}-util-mean", "Utilization", show(row.get("gpu_util_mean"), pct),
                 busy_note(row.get("busy_metric"))),
            card(f"{key}-util-p95", "Utilization p95", show(row.get("gpu_util_p95"), pct),
                 f"peak/avg {show(row.get('peak_to_average'), _ratio)}"),
            card(f"{key}-provisioned", "Provisioned", show(provisioned, usd), "GPU-hours × hourly rate"),
            card(f"{key}-busy", "Busy cost", show(row.get("busy_cost_usd"), usd), "provisioned × utilization"),
            card(f"{key}-idle", "Idle cost", show(idle, usd), idle_hint, "card-idle" if idle else ""),
        ]),
    ])


def deployment_panels(rows: list[dict[str, Any]]) -> list[html.Section] | html.Div:
    if not rows:
        return empty("No deployments configured: add them under `deployments:` to see GPU cost.")
    return [deployment_panel(i, row) for i, row in enumerate(rows)]


def totals(rows: list[dict[str, Any]]) -> str:
    idle = [r["idle_cost_usd"] for r in rows if r.get("idle_cost_usd") is not None]
    provisioned = [r["provisioned_cost_usd"] for r in rows if r.get("provisioned_cost_usd") is not None]
    if not provisioned:
        return ""
    return f"Idle GPU cost {usd(sum(idle)) if idle else NULL} of {usd(sum(provisioned))} provisioned"


CHARTS = (
    Chart("util", "Utilization over time", (Line("gpu_utilization", "utilization", "deployment"),), unit="%"),
    Chart("idle", "Idle cost over time", (Line("idle_cost_usd", "idle", "deployment"),), unit="$", stacked=True),
)


SHARE_COLUMNS = (
    ("deployment", "Deployment", str), ("requests", "Requests", integer),
    ("input_tokens", "Input tokens", integer), ("output_tokens", "Output tokens", integer),
    ("busy_cost_usd", "Busy GPU cost", usd), ("loaded_cost_usd", "Fully loaded", usd),
)


def tenant_shares(source: data.DataSource, filters: data.Filters) -> list[dict[str, Any]]:
    """The reader's requests' share of each self-hosted deployment's GPU cost: the cost
    report by deployment (narrowed to their tenant by the source), busy and fully loaded."""
    self_hosted = {d.name for d in source.settings.deployments}
    # one reading (data.one_reading): both views share the deployments' GPU frames and token totals
    busy, loaded = (source.rows("cost", filters, by="deployment", view=view) for view in ("busy", "fully_loaded"))
    loaded_cost = {r["deployment"]: r.get("cost_usd") for r in loaded}
    return [{**r, "busy_cost_usd": r.get("cost_usd"), "loaded_cost_usd": loaded_cost.get(r["deployment"])}
            for r in busy if r["deployment"] in self_hosted]


def share_totals(rows: list[dict[str, Any]]) -> str:
    busy = [r["busy_cost_usd"] for r in rows if r.get("busy_cost_usd") is not None]
    loaded = [r["loaded_cost_usd"] for r in rows if r.get("loaded_cost_usd") is not None]
    if not busy and not loaded:
        return ""
    return (f"Your share of GPU cost {usd(sum(busy)) if busy else NULL} busy, "
            f"{usd(sum(loaded)) if loaded else NULL} fully loaded")


SHARE_NOTE = ("Each deployment's GPU cost is shared among its requests by weighted tokens; these are your "
              "requests' shares. Busy: the GPUs' busy time; fully loaded: their idle time spread too. "
              "Utilization and idle cost are the whole fleet's and are shown to admins and viewers.")


def layout(**_query: str) -> html.Div:
    if not access.principal().reads_every_tenant:
        return page(
            "gpus", "GPUs",
            html.Div(id="gpus-total", className="page-summary"),
            html.Div(id="gpus-deployments", children=LOADING),
            # the fleet's per-GPU parts stay in the tree, hidden: the page's one refresh reads them
            html.Div(hidden=True, children=[search_box("gpus-search", "GPUs"), html.Div(id="gpus-table")]),
        )
    return page(
        "gpus", "GPUs",
        html.Div(id="gpus-total", className="page-summary"),
        timecharts.charts_row("gpus", CHARTS),
        html.Div(id="gpus-deployments", children=LOADING),
        panel("Per GPU", search_box("gpus-search", "GPUs"), html.Div(id="gpus-table", children=LOADING)),
    )


class Shares:
    """What a tenant viewer's refresh read: their shares (tenant_shares), nothing of the
    fleet's. (A plain class: Dash Pages loads this module outside sys.modules, where a
    dataclass cannot be defined.)"""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows


def fetch(source: data.DataSource, filters: data.Filters, search: str | None) -> tuple | Shares:
    if source.restricted:
        return Shares(tenant_shares(source, filters))
    # deployments are the configured ones (a bounded list); GPUs are whatever reports samples
    return (source.rows("utilization", filters, by="deployment"),
            source.top("utilization", filters, "gpu", "idle_cost_usd", search))


def render(fetched: tuple | Shares, filters: data.Filters) -> tuple:
    if isinstance(fetched, Shares):
        shares = fetched.rows
        return (panel("Your share of GPU cost", html.P(SHARE_NOTE, className="muted"),
                      html.Div(id="gpus-share", children=table(
                          shares, SHARE_COLUMNS, "None of your requests ran on a self-hosted deployment in this "
                                                 "window."))),
                None, share_totals(shares), updated_line(filters))
    deployments, gpus = fetched
    return (deployment_panels(deployments),
            top_table(gpus, GPU_COLUMNS, "No GPU samples in this window.", "GPUs", "idle cost"),
            totals(deployments), updated_line(filters))


def register_callbacks(app: dash.Dash) -> None:
    register_refresh(app, "gpus", ("deployments", "table", "total", "updated"), fetch, render, controls=("search",))
    timecharts.register(app, "gpus", CHARTS)
