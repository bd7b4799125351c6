"""TLS (--tls-cert/--tls-key) on all three servers: the real OTel SDK exporters over HTTPS and
gRPC with TLS, the dashboard's API over HTTPS, and a plain-HTTP client on the TLS port
answered by a closed connection while the server goes on."""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import socket
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from servelens.collector.service import Collector
from servelens.core.config import ConfigError
from servelens.dashboard.app import create_app
from servelens.dashboard.server import DashboardServer

pytestmark = pytest.mark.integration


def _self_signed(directory: Path, names: tuple[str, ...] = ("localhost", "127.0.0.1")) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])
    alt = [x509.IPAddress(ipaddress.ip_address(n)) if n.replace(".", "").isdigit() else x509.DNSName(n) for n in names]
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


@pytest.fixture
def pem(tmp_path: Path) -> tuple[Path, Path]:
    return _self_signed(tmp_path)


@pytest.fixture
def settings(make_settings, pem):
    return make_settings(tls_cert=str(pem[0]), tls_key=str(pem[1]))


def _send(exporter, n: int, service: str) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=60_000))
    tracer = provider.get_tracer("tls-tests")
    for i in range(n):
        with tracer.start_as_current_span("chat m", attributes={"gen_ai.request.model": "m", "filler": "x" * 200,
                                                                 "gen_ai.operation.name": "chat"}):
            pass
    assert provider.force_flush(30_000)
    provider.shutdown()


def _count(store, service: str) -> int:
    return store.client().query("SELECT count() FROM otel_traces WHERE ServiceName = {s:String}",
                                parameters={"s": service}).first_row[0]


def test_the_sdk_exports_over_https_and_grpc_tls_and_the_api_answers_over_https(settings, store, pem, monkeypatch):
    cert = pem[0]
    # requests lets these override the exporter's own CA file (psf/requests#3829)
    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)
    collector = Collector(settings, store)
    collector.start()
    dashboard = DashboardServer(create_app(settings, store), "127.0.0.1", 0, tls_context=settings.tls_context())
    dashboard.start()
    try:
        # 300 spans of ~300 bytes: one request of many TLS records
        _send(HttpExporter(endpoint=f"https://127.0.0.1:{collector.http.port}/v1/traces", certificate_file=str(cert),
                           timeout=20), 300, "over-https")
        _send(GrpcExporter(endpoint=f"127.0.0.1:{collector.grpc.port}", insecure=False, timeout=20,
                           credentials=grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())),
              50, "over-grpc-tls")
        assert (_count(store, "over-https"), _count(store, "over-grpc-tls")) == (300, 50)

        context = ssl.create_default_context(cafile=str(cert))
        assert dashboard.url.startswith("https://")
        with urllib.request.urlopen(f"{dashboard.url}/api/v1/health", context=context, timeout=30) as resp:
            assert json.loads(resp.read())["status"] == "ok"

        # plain HTTP on the TLS port: no answer, the connection is closed, nothing else is hurt
        with socket.create_connection(("127.0.0.1", dashboard.port), timeout=10) as plain:
            plain.sendall(b"GET /api/v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            try:
                assert plain.recv(4096) == b""  # closed without a word in clear
            except ConnectionResetError:
                pass
        with urllib.request.urlopen(f"{dashboard.url}/api/v1/health", context=context, timeout=30) as resp:
            assert resp.status == 200
        # an untrusted client (no CA) is refused by its own TLS check, not served in clear
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(f"{dashboard.url}/api/v1/health", timeout=10)
    finally:
        dashboard.shutdown()
        collector.shutdown()


def test_a_missing_or_unmatched_key_is_a_clear_config_error(make_settings, pem, tmp_path):
    with pytest.raises(ConfigError, match="tls_cert and tls_key go together"):
        make_settings(tls_cert=str(pem[0]))
    other = _self_signed(tmp_path / "other" if (tmp_path / "other").mkdir() is None else tmp_path)
    with pytest.raises(ConfigError, match="cannot load the TLS certificate"):
        make_settings(tls_cert=str(pem[0]), tls_key=str(other[1])).tls_context()


def test_the_demo_sends_over_tls_to_its_own_receiver_trusting_only_its_certificate(make_settings, store, tmp_path):
    """`up --demo --tls-cert ...`: the demo dials 127.0.0.1, which a real certificate does
    not name; it trusts exactly the certificate its process serves, and no other."""
    from servelens.core.tls import pinned_client_context
    from servelens.demo.traffic import DemoTraffic

    cert, key = _self_signed(tmp_path, ("servelens.example.test",))  # no loopback name in it
    collector = Collector(make_settings(tls_cert=str(cert), tls_key=str(key)), store)  # the test's database
    collector.start()
    url = f"https://127.0.0.1:{collector.http.port}"
    try:
        demo = DemoTraffic(url, rate_per_s=0.5, seed=5, tls=pinned_client_context(cert))
        try:
            sent = demo.backfill(minutes=10)
        finally:
            demo.shutdown(10.0)
        assert sent > 0
        assert store.client().query("SELECT count() FROM llm_requests").first_row[0] > 0
        assert store.client().query("SELECT count() FROM gpu_samples").first_row[0] == demo.gpus.sent_samples > 0
        # a certificate the server does not hold is refused: the pin is a pin
        other, _ = _self_signed(tmp_path / "other" if (tmp_path / "other").mkdir() is None else tmp_path)
        impostor = DemoTraffic(url, rate_per_s=0.5, seed=6, tls=pinned_client_context(other))
        try:
            with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
                impostor.gpus.sample(time.time())
        finally:
            impostor.shutdown(5.0)
    finally:
        collector.shutdown()

