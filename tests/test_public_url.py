"""public_url (issue 14): where readers reach the dashboard, for alert links and the printed
URL. Without it (nor alerts.dashboard_url), a wildcard bind is named by this machine's
hostname, never http://0.0.0.0:PORT/."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

from servelens.analytics.alerts import Dispatcher
from servelens.app import cli
from servelens.app.runtime import dashboard_url
from servelens.core.config import ConfigError, load
from tests.analytics.test_alerts import FIRING, HttpReceiver

PUBLIC = "https://servelens.example.com/"
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def hook():
    receiver = HttpReceiver()
    yield receiver
    receiver.close()


def test_public_url_from_flag_env_and_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "servelens.yaml"
    config.write_text(json.dumps({"public_url": "http://from-file:8050/"}))
    args = ["dashboard", "--config", str(config)]
    assert cli.settings_from(cli.build_parser().parse_args(args)).public_url == "http://from-file:8050/"
    monkeypatch.setenv("SERVELENS_PUBLIC_URL", "http://from-env/")
    assert cli.settings_from(cli.build_parser().parse_args(args)).public_url == "http://from-env/"
    flagged = cli.build_parser().parse_args([*args, "--public-url", PUBLIC])
    assert cli.settings_from(flagged).public_url == PUBLIC
    with pytest.raises(ConfigError, match="public_url: .*http:// or https://"):
        load(None, public_url="servelens.example.com")


@pytest.mark.parametrize(("configured", "expected"), [
    ({"public_url": PUBLIC, "alerts": {"dashboard_url": "http://old/"}}, PUBLIC),  # public_url wins
    ({"alerts": {"dashboard_url": "http://old/"}}, "http://old/"),  # older configs keep working
    ({"host": "0.0.0.0"}, f"http://{socket.gethostname()}:8050/"),
    ({"host": "::"}, f"http://{socket.gethostname()}:8050/"),
    ({"host": "::1"}, "http://[::1]:8050/"),
    ({"host": "127.0.0.1"}, "http://127.0.0.1:8050/"),
])
def test_dashboard_url_precedence(configured: dict, expected: str) -> None:
    assert dashboard_url(load(None, **configured)) == expected


def test_alert_links_use_public_url(make_settings, hook: HttpReceiver) -> None:
    settings = make_settings(public_url=PUBLIC, alerts={"dashboard_url": "http://old/",
                                                        "sinks": [{"type": "webhook", "url": hook.url}]})
    d = Dispatcher(settings, "http://0.0.0.0:8050/")  # what the runtime derives loses to the configured URL
    d.start()
    try:
        d.publish(FIRING, "firing")
        [request] = hook.wait_for(1)
    finally:
        d.shutdown(1.0)
    assert request["body"]["dashboard_url"] == f"{PUBLIC}triggers?id=t-1"


def test_alerts_test_links_the_hostname_on_a_wildcard_bind(tmp_path: Path, hook: HttpReceiver, capsys) -> None:
    config = tmp_path / "servelens.yaml"
    config.write_text(json.dumps({"alerts": {"sinks": [{"type": "webhook", "url": hook.url}]}}))
    assert cli.main(["alerts", "test", "--config", str(config), "--host", "0.0.0.0", "--ui-port", "8050"]) == 0
    link = hook.wait_for(1)[0]["body"]["dashboard_url"]
    assert link.startswith(f"http://{socket.gethostname()}:8050/triggers?id=")
    assert "0.0.0.0" not in link


@pytest.mark.integration
@pytest.mark.parametrize("public", [None, PUBLIC], ids=["wildcard", "public-url-env"])
def test_printed_dashboard_url(tmp_path: Path, public: str | None) -> None:
    """`servelens dashboard --host 0.0.0.0` prints a URL a reader can open; it is only ever
    contacted here on 127.0.0.1."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SERVELENS_")}
    env["SERVELENS_ADMIN_PASSWORD"] = "an admin's password"  # bound to the network: never open
    if public:
        env["SERVELENS_PUBLIC_URL"] = public
    proc = subprocess.Popen(
        [sys.executable, "-m", "servelens", "dashboard", "--host", "0.0.0.0", "--ui-port", "0",
         "--data-dir", str(tmp_path / "data"), "--log-level", "WARNING"],
        cwd=tmp_path, env={**env, "PYTHONPATH": str(ROOT / "src")}, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout.readline() for _ in range(2)), daemon=True)
    reader.start()
    try:
        reader.join(90)
        assert len(lines) == 2, f"servelens dashboard printed {lines!r}"
        port = int(re.search(r"ui=(\d+)", lines[0]).group(1))
        expected = public or f"http://{socket.gethostname()}:{port}/"
        assert lines[1] == f"servelens dashboard: {expected}\n"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/health", timeout=30) as response:
            assert response.status == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
