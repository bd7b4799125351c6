"""What a page load reads on a fleet store, in this process (BENCHMARKS.md, "Dashboard:
refreshes that overlap share one reading").

    .venv/bin/python -m bench.dashboard_reads --fleet /tmp/fleet10m [--ranges 24h,7d,30d]

Per range, median of 3 after a first, the window ending now (as the pages read it: a
store bench.fleet_data wrote lately, or the windows hold less than the range):
1. each page's refreshes started at once in threads, as a browser sends them on a load
   (`--pages`, the pages' prefixes), each with its controls' values as the page's layout
   sets them (the Cost page's grouping is tenant): wall seconds and the queries they ran;
2. the top bar's filter options (dashboard.data.DataSource.filter_options);
3. the `quality` report (the window's slices and their baseline).
No answer is shared between rounds (the results cache is not on this path). Prints the
figures, so that two trees can be compared on one store (PYTHONPATH=<tree>/src). Writes
nothing.
"""

from __future__ import annotations

import argparse
import threading
from typing import Any

import dash

from bench.report import QueryLog, median_after_first, open_fleet
from servelens.analytics.reports import registry
from servelens.dashboard import components, data
from servelens.dashboard.app import create_app


def _initial(component: Any, wanted: set[str], found: dict[str, Any]) -> None:
    """The `value` of every component of a layout whose id is in `wanted`."""
    if getattr(component, "id", None) in wanted:
        found[component.id] = getattr(component, "value", None)
    children = getattr(component, "children", None)
    for child in children if isinstance(children, (list, tuple)) else [children]:
        if child is not None and not isinstance(child, (str, int, float)):
            _initial(child, wanted, found)


def control_values(app: Any, prefix: str, alert_name: str) -> tuple:
    """The values a browser sends for a refresh's controls on a page's first load: the
    callback's inputs after the filters and the interval, as the page's layout sets them."""
    callback = next(v for k, v in app.callback_map.items() if f"..{prefix}-{alert_name}.children.." in f"{k}..")
    ids = [i["id"] for i in callback["inputs"][2:]]
    found: dict[str, Any] = {}
    for page in dash.page_registry.values():
        if set(ids) <= set(found):
            break
        layout = page["layout"]
        with app.server.test_request_context(page["path"]):
            try:
                _initial(layout() if callable(layout) else layout, set(ids), found)
            except RuntimeError:  # a layout that reads the signed-in user: not one with controls here
                continue
    return tuple(found.get(i) for i in ids)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fleet", required=True, help="a bench.fleet_data directory")
    parser.add_argument("--ranges", default="24h,7d,30d")
    parser.add_argument("--pages", default="overview,cost,lat,qual,gpus", help="refresh prefixes")
    args = parser.parse_args(argv)
    settings, store = open_fleet(args.fleet)
    app = create_app(settings, store)
    source = data.source_of(app.server)
    refreshes = app.server.extensions[components._REFRESHES]
    for key in args.ranges.split(","):
        filters = data.Filters(key)
        for prefix in args.pages.split(","):
            mine = [(fetch, control_values(app, prefix, alert)) for owner, alert, _, fetch in refreshes
                    if owner == prefix]

            def load_page() -> None:
                threads = [threading.Thread(target=components._read, args=(fetch, source, filters, values))
                           for fetch, values in mine]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
            with QueryLog(store) as log:
                load_page()
            queries = len(log.entries)
            print(f"{key:>4} {prefix:9} {len(mine)} refreshes at once: {median_after_first(load_page)[0]:.2f} s, {queries} queries",
                  flush=True)
        print(f"{key:>4} filter options: {median_after_first(lambda: source.filter_options(key))[0]:.3f} s", flush=True)

        def quality() -> None:
            registry.run("quality", store, settings, {k: v.isoformat() for k, v in filters.params().items()})
        print(f"{key:>4} quality report: {median_after_first(quality)[0]:.3f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
