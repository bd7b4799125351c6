"""The HTTP transport alone: waitress configured as the collector's HttpReceiver, with an
app that reads the body and answers 200 without decoding it. Run by bench.ingest in its
own process on the collector's core, so its CPU time per span is what HTTP costs the
collector (the rest of the receiver's time is parse, mapping and the insert).

    python -m bench.http_sink      prints the port, serves until killed
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from typing import Any

from waitress.server import create_server


def app(environ: dict[str, Any], start_response: Callable) -> Iterable[bytes]:
    environ["wsgi.input"].read()
    start_response("200 OK", [("Content-Type", "application/x-protobuf"), ("Content-Length", "0")])
    return [b""]


def main() -> int:
    # The same options as collector.http_receiver.HttpReceiver.
    server = create_server(app, host="127.0.0.1", port=0, threads=8, max_request_body_size=16 * 1024 * 1024 + 1,
                           ident="servelens", clear_untrusted_proxy_headers=True, asyncore_loop_timeout=0.1)
    print(f"otlp-http={server.effective_port}", flush=True)
    server.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
