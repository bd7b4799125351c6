"""The model that served a request, for reports grouped or filtered by model.

llm_requests.Model is the model that answered, else the one asked for. A request refused
before any model answered (HTTP 429, a timeout, a 5xx from the gateway) carries only the
model asked for, the alias ("gpt-4o"), while the same service's answered requests name
the model that served them ("gpt-4o-2024-08-06"): grouped by Model, one model family is
two rows. As Langfuse and Datadog show it, a model is one row: here a row whose Model is
only its RequestModel takes the served name its service's answered requests for that
RequestModel got in the same window (the most frequent one, when an alias moved).

What stays as stored: rows without a RequestModel (dialects that name one model only, rows
stored before migration 0021), models served under their requested name (self-hosted
engines: nothing to map), and aliases no request in the window was answered for.
"""

from __future__ import annotations

# One row per (service, requested model) answered under another name in the hours the
# window touches (model_aliases, migration 0022): the served name most requests got
# (ties: the greatest name, so every run picks the same).
_ANSWERED = """(
    SELECT CAST((groupArray(pair), groupArray(served)), 'Map(String, String)')
    FROM (SELECT concat(toString(ServiceName), '\\0', toString(RequestModel)) AS pair,
                 argMax(served, (n, served)) AS served
          FROM (SELECT ServiceName, RequestModel, toString(Model) AS served, sum(Requests) AS n
                FROM model_aliases
                WHERE Hour >= toStartOfHour(fromUnixTimestamp64Nano({since_ns:Int64}))
                  AND Hour < fromUnixTimestamp64Nano({until_ns:Int64})
                GROUP BY ServiceName, RequestModel, served)
          GROUP BY pair))"""


def served_model_sql(*, service: str = "ServiceName", model: str = "Model", request_model: str = "RequestModel") -> str:
    """A SQL expression over a row: the model that served the request.

    The evidence is what the rows' services were answered with in the hours of the window
    ({since_ns:Int64}, {until_ns:Int64}: ReportQuery.where's parameters), whatever
    tenant, feature or model a report is narrowed to: which model a service's alias
    resolves to is the service's. The mapping is one scalar subquery, computed once per
    query, over model_aliases (a few rows per service, alias and hour).

    The column arguments name the row's columns. For a rollup's rows (no RequestModel:
    rollup_requests_1m, rollup_costs_15m) pass request_model=<its model column>: a rollup
    row whose model is an alias its service was answered for under another name holds
    that alias's unanswered requests, and is mapped like them.
    """
    pair = f"concat(toString({service}), '\\0', toString({request_model}))"
    return (f"if({request_model} != '' AND {model} = {request_model}, "
            f"ifNull(nullIf({_ANSWERED}[{pair}], ''), toString({model})), toString({model}))")
