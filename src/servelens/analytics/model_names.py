"""The model that served a request, for reports grouped or filtered by model.

llm_requests.Model is the model that answered, else the one asked for. A request refused
before any model answered (HTTP 429, a timeout, a 5xx from the gateway) carries only the
model asked for, the alias ("gpt-4o"), while the same service's answered requests name
the model that served them ("gpt-4o-2024-08-06"): grouped by Model, one model family is
two rows. As Langfuse and Datadog show it, a model is one row: here a row whose Model is
only its RequestModel takes the served name its service's answered requests for that
RequestModel got in the same window (the most frequent one, when an alias moved). A
service none of whose requests for the alias was answered in the window (all refused or
timed out) takes the name the rest of the fleet was served for it, the most frequent: a
provider resolves an alias the same for every caller. A service's own answers, where it has
any, decide for it: those under another name, or those that name no other model (a
self-hosted engine serving the name as it is, a library that reports only the model asked
for), which keep the name as stored.

A row without a RequestModel (a dialect that names one model only, as Langfuse's does, or
a row stored before migration 0021) is read as asked under its Model: a refused Langfuse
generation names the alias it asked for. What stays as stored: models served under their
requested name (self-hosted engines: nothing to map), and aliases no request of the fleet
in the window was answered for.
"""

from __future__ import annotations

# What each service's requests for an alias resolve to in the hours the window touches,
# keyed "service\0alias": the name most of its requests answered under another name got
# (model_aliases, migration 0022; ties: the greatest name, so every run picks the same);
# where it has none, nothing if some of its requests for the alias did not fail (they name
# no other model: the hour rollup's requests less its errors), else the fleet's most
# frequent answer. The evidence, one row per service, alias and served name ("\0": under
# the alias itself), is read for the aliases only, so the map stays a few entries per alias
# whatever the number of models; it is resolved in the subquery, and a row looks its pair
# up once (each lookup in a Map reads its keys).
_WINDOW_HOURS = """WHERE {time} >= toStartOfHour(fromUnixTimestamp64Nano({{since_ns:Int64}}))
                        AND {time} < fromUnixTimestamp64Nano({{until_ns:Int64}})"""
_EVIDENCE = f"""
    SELECT service, alias, served, sum(n) AS n
    FROM (SELECT toString(ServiceName) AS service, toString(RequestModel) AS alias, toString(Model) AS served,
                 toUInt64(Requests) AS n
          FROM model_aliases {_WINDOW_HOURS.format(time="Hour")}
          UNION ALL
          SELECT toString(ServiceName), toString(Model), '\\0', toUInt64(Requests - Errors)
          FROM rollup_requests_1h {_WINDOW_HOURS.format(time="Minute")}
            AND Model IN (SELECT RequestModel FROM model_aliases {_WINDOW_HOURS.format(time="Hour")}))
    GROUP BY service, alias, served"""
_ANSWERED = f"""(
    SELECT CAST((groupArray(concat(service, '\\0', alias)), groupArray(served)), 'Map(String, String)')
    FROM (SELECT service, alias,
                 if(argMaxIf(served, (n, served), served != '\\0') AS here != '', here,
                    if(sumIf(n, served = '\\0') > 0, '', any(fleet))) AS served
          FROM (SELECT service, alias, served, n,
                       argMaxIf(served, (fleet_n, served), served != '\\0') OVER (PARTITION BY alias) AS fleet
                FROM (SELECT service, alias, served, n, sum(n) OVER (PARTITION BY alias, served) AS fleet_n
                      FROM ({_EVIDENCE})))
          GROUP BY service, alias)
    WHERE served != '')"""


def served_model_sql(*, service: str = "ServiceName", model: str = "Model", request_model: str = "RequestModel") -> str:
    """A SQL expression over a row: the model that served the request.

    The evidence is what the rows' services were answered with in the hours of the window
    ({since_ns:Int64}, {until_ns:Int64}: ReportQuery.where's parameters), whatever
    tenant, feature or model a report is narrowed to: which model a service's alias
    resolves to is the service's where it was answered in the window, else the fleet's.
    The mapping is one scalar subquery, computed once per query, over model_aliases and
    the hour rollup (a few rows per service, alias and hour).

    The column arguments name the row's columns. For a rollup's rows (no RequestModel:
    rollup_requests_1m, rollup_costs_15m) pass request_model=<its model column>: a rollup
    row whose model is an alias its service was answered for under another name holds
    that alias's unanswered requests, and is mapped like them.
    """
    # The name a row was asked under: its RequestModel, or its Model where the row names no
    # other (a dialect that names one model only, such as Langfuse's, names the alias a
    # refused request asked for).
    asked = f"({request_model} = '' OR {model} = {request_model})"
    pair = f"concat(toString({service}), '\\0', toString({model}))"
    return (f"if({asked}, ifNull(nullIf({_ANSWERED}[{pair}], ''), toString({model})), toString({model}))")
