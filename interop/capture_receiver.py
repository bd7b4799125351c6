"""A minimal OTLP/HTTP receiver that keeps every export request as it came.

POST /v1/traces, /v1/metrics, /v1/logs (and any path ending in those, such as
Langfuse's /api/public/otel/v1/traces) are answered 200 with an empty
Export{Trace,Metrics,Logs}ServiceResponse -- a message with no fields set, whose
protobuf encoding is zero bytes -- and the request body is written verbatim to
<outdir>/<signal>-<seq>.binpb (seq counts per signal from 001). A chunked body
(Transfer-Encoding: chunked, as OTel JS sends) is de-chunked; one sent with
Content-Encoding: gzip is stored decompressed, so every file is a plain
Export*ServiceRequest. A JSON body (application/json) is kept as .json.

Each request is also appended to <outdir>/requests.jsonl (path, file, sizes,
content type, user agent, whether an Authorization header came), which is not
part of the capture itself.

Other POSTs get 200 with "{}" and are only logged, so SDKs that call side APIs
(e.g. Langfuse's ingestion endpoints) keep working.

Run: python interop/capture_receiver.py --outdir DIR --port 0 --port-file PORT
Stdlib only, so it runs in any venv.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SIGNALS = ("traces", "metrics", "logs")


def make_handler(outdir: str, log_path: str):
    lock = threading.Lock()
    counters = {s: 0 for s in SIGNALS}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "capture-receiver/1.0"

        def log_message(self, fmt, *args):
            pass

        def _answer(self, status: int, body: bytes, ctype: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()

        def _log(self, entry: dict) -> None:
            with lock, open(log_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(entry, sort_keys=True) + "\n")

        def do_GET(self):
            self._log({"method": "GET", "path": self.path})
            self._answer(200, b"{}", "application/json")

        def _read_chunked(self) -> bytes:
            # OTel JS's OTLP/HTTP exporters pipe the body: Transfer-Encoding: chunked, no Content-Length.
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
                        pass
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()  # the CRLF after each chunk

        def do_POST(self):
            chunked = "chunked" in (self.headers.get("Transfer-Encoding") or "").lower()
            n = int(self.headers.get("Content-Length") or 0)
            raw = self._read_chunked() if chunked else (self.rfile.read(n) if n else b"")
            path = self.path.split("?", 1)[0].rstrip("/")
            signal = next((s for s in SIGNALS if path.endswith("/v1/" + s)), None)
            ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
            enc = (self.headers.get("Content-Encoding") or "").strip().lower()
            entry = {"method": "POST", "path": self.path, "content_type": ctype,
                     "content_encoding": enc or None, "bytes": len(raw),
                     "user_agent": self.headers.get("User-Agent"),
                     "authorization": bool(self.headers.get("Authorization")),
                     "transfer_encoding": "chunked" if chunked else None}
            if signal is None:
                self._log(entry)
                self._answer(200, b"{}", "application/json")
                return
            body = raw
            if enc == "gzip":
                body = gzip.decompress(raw)
            elif enc == "deflate":
                body = zlib.decompress(raw)
            ext = "json" if ctype == "application/json" else "binpb"
            with lock:
                counters[signal] += 1
                name = f"{signal}-{counters[signal]:03d}.{ext}"
            with open(os.path.join(outdir, name), "wb") as f:
                f.write(body)
            entry.update(file=name, stored_bytes=len(body))
            self._log(entry)
            if ext == "json":
                self._answer(200, b"{}", "application/json")
            else:
                # An empty Export*ServiceResponse serializes to zero bytes.
                self._answer(200, b"", "application/x-protobuf")

    return Handler


def serve(outdir: str, port: int = 0, log_path: str | None = None) -> ThreadingHTTPServer:
    """Start in a daemon thread; returns the server (server.server_port is the port)."""
    os.makedirs(outdir, exist_ok=True)
    httpd = ThreadingHTTPServer(("127.0.0.1", port),
                                make_handler(outdir, log_path or os.path.join(outdir, "requests.jsonl")))
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--outdir", required=True)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--port-file")
    ap.add_argument("--log", help="request log (default <outdir>/requests.jsonl)")
    args = ap.parse_args()
    os.makedirs(args.outdir, exist_ok=True)
    log_path = args.log or os.path.join(args.outdir, "requests.jsonl")
    httpd = ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(args.outdir, log_path))
    httpd.daemon_threads = True
    if args.port_file:
        with open(args.port_file + ".tmp", "w") as f:
            f.write(str(httpd.server_port))
        os.replace(args.port_file + ".tmp", args.port_file)
    print(f"OTLP capture on http://127.0.0.1:{httpd.server_port} -> {args.outdir}",
          file=sys.stderr, flush=True)
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
