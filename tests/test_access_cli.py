"""`servelens users` / `servelens tokens` on the real store, the collector asking for the
tokens they make, and the refusal to run an open dashboard on the network."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest
import yaml
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult

from servelens.app import cli
from servelens.collector.service import Collector
from servelens.core.auth import passwords
from servelens.core.auth.credentials import Credentials

ROOT = Path(__file__).resolve().parent.parent
PASSWORD = "correct horse battery"


def _config(tmp_path: Path, settings) -> str:
    path = tmp_path / "servelens.yaml"
    path.write_text(yaml.safe_dump({"store": {"clickhouse_url": settings.store_url,
                                              "database": settings.store.database}}))
    return str(path)


def test_users_and_tokens_from_the_command_line(store, settings, tmp_path, capsys, monkeypatch) -> None:
    config = _config(tmp_path, settings)
    monkeypatch.setattr(sys, "stdin", io.StringIO(PASSWORD + "\n"))
    assert cli.main(["users", "add", "ops", "--role", "admin", "--password-stdin", "--config", config]) == 0
    monkeypatch.setattr(sys, "stdin", io.StringIO("short\n"))
    assert cli.main(["users", "add", "weak", "--role", "viewer", "--password-stdin", "--config", config]) == 2
    assert cli.main(["users", "add", "t", "--role", "tenant", "--password-stdin", "--config", config]) == 2
    capsys.readouterr()
    assert cli.main(["users", "list", "--json", "--config", config]) == 0
    assert json.loads(capsys.readouterr().out) == [{"name": "ops", "role": "admin", "tenants": [], "source": "store"}]
    assert Credentials(store, settings).sign_in("ops", PASSWORD) is not None

    assert cli.main(["tokens", "create", "--role", "ingest", "--tenant", "acme", "--name", "ci", "--expires", "30d",
                     "--config", config]) == 0
    raw = capsys.readouterr().out.strip()
    assert raw.startswith("sl_")
    assert cli.main(["tokens", "list", "--json", "--config", config]) == 0
    [listed] = json.loads(capsys.readouterr().out)
    assert raw not in json.dumps(listed) and listed["role"] == "ingest" and listed["tenants"] == ["acme"]
    who = Credentials(store, settings).token(raw)
    assert (who.role, who.tenants) == ("ingest", ("acme",))
    assert cli.main(["tokens", "revoke", listed["id"], "--config", config]) == 0
    capsys.readouterr()
    assert Credentials(store, settings).token(raw) is None
    actions = [a for (a,) in store.client().query("SELECT action FROM audit_log ORDER BY time").result_rows]
    assert actions == ["user_saved", "token_created", "token_revoked"]

    monkeypatch.setattr(sys, "stdin", io.StringIO(PASSWORD + "\n"))
    assert cli.main(["users", "hash", "--password-stdin"]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed.startswith("$argon2id$") and passwords.verify(printed, PASSWORD)


def _export(url: str, token: str | None) -> SpanExportResult:
    exporter = OTLPSpanExporter(endpoint=f"{url}/v1/traces", timeout=10,
                                headers={"Authorization": f"Bearer {token}"} if token else None)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    results = []
    original = exporter.export
    exporter.export = lambda spans: results.append(original(spans)) or results[-1]  # type: ignore[method-assign]
    with provider.get_tracer("t").start_as_current_span("chat m", attributes={"gen_ai.request.model": "m",
                                                                               "gen_ai.operation.name": "chat"}):
        pass
    provider.shutdown()
    return results[0]


@pytest.fixture
def receiver(store, settings) -> Iterator[tuple[Credentials, str]]:
    """A running collector whose credentials re-read the store at every request, and a
    Credentials of its own to change them: (credentials, the OTLP/HTTP base URL)."""
    collector = Collector(settings, store)
    collector.credentials.refresh_s = 0
    collector.start()
    yield Credentials(store, settings, refresh_s=0), f"http://127.0.0.1:{collector.http.port}"
    collector.shutdown()


@pytest.mark.integration
def test_the_collector_asks_for_the_stored_ingest_tokens(store, receiver) -> None:
    credentials, url = receiver
    assert _export(url, None) == SpanExportResult.SUCCESS  # no tokens anywhere: open
    raw, token = credentials.create_token("ci", "ingest", ("acme",))
    viewer, _ = credentials.create_token("dash", "viewer")
    assert _export(url, None) == SpanExportResult.FAILURE  # 401 now: a token exists
    assert _export(url, viewer) == SpanExportResult.FAILURE  # a viewer's token writes nothing
    assert _export(url, raw) == SpanExportResult.SUCCESS
    tenants = {t for (t,) in store.client().query("SELECT SpanAttributes['app.tenant'] FROM otel_traces")
               .result_rows}
    assert "acme" in tenants
    credentials.revoke_token(token.token_id)
    assert _export(url, raw) == SpanExportResult.FAILURE


@pytest.mark.integration
def test_metrics_need_a_token_once_access_control_is_on(receiver) -> None:
    credentials, base = receiver
    url = f"{base}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:  # loopback, no users: open
        assert resp.status == 200
    credentials.add_user("ops", PASSWORD, "admin")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url, timeout=10)
    assert refused.value.code == 401
    viewer, _ = credentials.create_token("prometheus", "viewer")
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {viewer}"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert b"servelens_" in resp.read()


@pytest.mark.integration
def test_an_open_dashboard_is_never_started_on_the_network(tmp_path: Path) -> None:
    """Bound to 0.0.0.0 with no admin: exit 2 and say how to fix it (nothing is contacted)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SERVELENS_")}
    done = subprocess.run(
        [sys.executable, "-m", "servelens", "dashboard", "--host", "0.0.0.0", "--ui-port", "0",
         "--data-dir", str(tmp_path / "data"), "--log-level", "WARNING"],
        cwd=tmp_path, env={**env, "PYTHONPATH": str(ROOT / "src")}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "SERVELENS_ADMIN_PASSWORD" in done.stderr and "servelens users add" in done.stderr
