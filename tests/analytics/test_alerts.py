"""Alert delivery (SPEC 7) against real receivers on 127.0.0.1.

A scripted HTTP server plays the webhook, Slack and Alertmanager endpoints (it can answer
503/400 or hang); a small SMTP receiver speaks enough RFC 5321 for smtplib. Every wait is
bounded; retry backoffs are configured in milliseconds so the suite stays fast.
"""

from __future__ import annotations

import email
import email.policy
import json
import socket
import socketserver
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from servelens.analytics.alerts import Dispatcher
from servelens.app import cli
from servelens.core.config import ConfigError, load

DASH = "http://dash.example:8050/"
LINK = "http://dash.example:8050/triggers?id=t-1"
FIRING = {
    "id": "t-1", "kind": "p99_drift", "subject": {"deployment": "llama-70b-prod"}, "state": "active",
    "started_at": "2026-03-01T10:00:00Z", "detected_at": "2026-03-01T10:05:00Z", "severity": "critical",
    "summary": "latency p99 1900 ms vs baseline 1200 ms; p50 flat",
    "evidence": {"p99_ms": 1900, "baseline_p99_ms": 1200, "p_value": 0.001},
}
RESOLVED = {**FIRING, "state": "resolved", "resolved_at": "2026-03-01T12:00:00Z"}
WARNING = {**FIRING, "id": "t-2", "severity": "warning"}
FAST = {"backoff": "10ms", "timeout": "2s"}  # retry quickly, give up on a hung peer quickly


# --- receivers ---------------------------------------------------------------------------

class HttpReceiver:
    """Records JSON POSTs; answers with scripted statuses (then 200), or "hang" until released."""

    def __init__(self, statuses: list[int | str] | None = None, default: int | str = 200) -> None:
        self.requests: list[dict[str, Any]] = []
        self.statuses = deque(statuses or [])
        self.default = default
        self.release = threading.Event()
        self._cond = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with receiver._cond:
                    status = receiver.statuses.popleft() if receiver.statuses else receiver.default
                    receiver.requests.append({"path": self.path, "headers": dict(self.headers), "body": body,
                                              "status": status})
                    receiver._cond.notify_all()
                if status == "hang":
                    receiver.release.wait(10)
                    return
                self.send_response(int(status))
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def wait_for(self, n: int, timeout: float = 5.0) -> list[dict[str, Any]]:
        with self._cond:
            self._cond.wait_for(lambda: len(self.requests) >= n, timeout)
            return list(self.requests)

    def bodies(self) -> list[Any]:
        return [r["body"] for r in self.requests]

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


class SmtpReceiver(socketserver.ThreadingTCPServer):
    """Just enough SMTP for smtplib: EHLO/HELO, MAIL, RCPT, DATA, RSET, NOOP, QUIT."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _SmtpSession)
        self.messages: list[dict[str, Any]] = []
        self.cond = threading.Condition()
        self.port = self.server_address[1]
        threading.Thread(target=self.serve_forever, args=(0.05,), daemon=True).start()

    def wait_for(self, n: int, timeout: float = 5.0) -> list[dict[str, Any]]:
        with self.cond:
            self.cond.wait_for(lambda: len(self.messages) >= n, timeout)
            return list(self.messages)

    def close(self) -> None:
        self.shutdown()
        self.server_close()


class _SmtpSession(socketserver.StreamRequestHandler):
    server: SmtpReceiver

    def reply(self, text: str) -> None:
        self.wfile.write(text.encode() + b"\r\n")

    def handle(self) -> None:
        self.reply("220 127.0.0.1 ESMTP test")
        sender, recipients = None, []
        for _ in range(100):  # bounded session
            line = self.rfile.readline(65536).decode()
            verb, _, arg = line.strip().partition(" ")
            verb = verb.upper()
            if not line or verb == "QUIT":
                self.reply("221 bye")
                return
            if verb == "EHLO":
                self.reply("250-127.0.0.1\r\n250 8BITMIME")
            elif verb in ("HELO", "NOOP", "RSET"):
                sender, recipients = (None, []) if verb == "RSET" else (sender, recipients)
                self.reply("250 ok")
            elif verb == "MAIL":
                sender = arg.partition(":")[2].strip().strip("<>")
                self.reply("250 ok")
            elif verb == "RCPT":
                recipients.append(arg.partition(":")[2].strip().strip("<>"))
                self.reply("250 ok")
            elif verb == "DATA":
                self.reply("354 end with .")
                data = b""
                while (chunk := self.rfile.readline(65536)) not in (b".\r\n", b""):
                    data += chunk[1:] if chunk.startswith(b"..") else chunk  # undo dot-stuffing
                with self.server.cond:
                    self.server.messages.append({"from": sender, "to": recipients,
                                                 "message": email.message_from_bytes(data.replace(b"\r\n", b"\n"),
                                                                                      policy=email.policy.default)})
                    self.server.cond.notify_all()
                self.reply("250 queued")
            else:
                self.reply("502 not implemented")


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/hook"  # nothing listens once closed


def until(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


@pytest.fixture
def receivers() -> Iterator[Callable[..., HttpReceiver]]:
    made: list[HttpReceiver] = []

    def make(*args: Any, **kwargs: Any) -> HttpReceiver:
        made.append(HttpReceiver(*args, **kwargs))
        return made[-1]

    yield make
    for r in made:
        r.close()


@pytest.fixture
def smtp() -> Iterator[SmtpReceiver]:
    server = SmtpReceiver()
    yield server
    server.close()


@pytest.fixture
def dispatcher(make_settings) -> Iterator[Callable[..., Dispatcher]]:
    made: list[Dispatcher] = []

    def make(*sinks: dict[str, Any], dashboard_url: str | None = DASH) -> Dispatcher:
        d = Dispatcher(make_settings(alerts={"sinks": list(sinks)}), dashboard_url)
        d.start()
        made.append(d)
        return d

    yield make
    for d in made:
        d.shutdown(1.0)


# --- message shapes ----------------------------------------------------------------------

def test_webhook_firing_and_resolved_bodies(receivers, dispatcher) -> None:
    hook = receivers()
    d = dispatcher({"type": "webhook", "url": hook.url + "/hook", "headers": {"X-Token": "s3cret"}})
    d.publish(FIRING, "firing")
    d.publish(RESOLVED, "resolved")
    got = hook.wait_for(2)
    assert [r["body"] for r in got] == [
        {**FIRING, "dashboard_url": LINK, "transition": "firing"},
        {**RESOLVED, "dashboard_url": LINK, "transition": "resolved"},
    ]
    assert got[0]["path"] == "/hook"
    assert got[0]["headers"]["Content-Type"] == "application/json"
    assert got[0]["headers"]["X-Token"] == "s3cret"
    assert until(lambda: d.stats() == {"webhook:127.0.0.1": {"sent": 2}})


def test_slack_text(receivers, dispatcher) -> None:
    slack = receivers()
    dispatcher({"type": "slack", "url": slack.url + "/services/T0/B0/x"}).publish(FIRING, "firing")
    assert slack.wait_for(1)[0]["body"] == {"text": (
        "[servelens] FIRING critical p99_drift on deployment=llama-70b-prod: "
        f"latency p99 1900 ms vs baseline 1200 ms; p50 flat <{LINK}|open in servelens>")}


def test_alertmanager_firing_then_resolved(receivers, dispatcher) -> None:
    am = receivers()
    host = am.url.removeprefix("http://")
    d = dispatcher({"type": "alertmanager", "url": f"http://ops:pw@{host}"})
    trigger = {**FIRING, "subject": {"deployment": "llama-70b-prod", "app.task_type": "rag"}}
    d.publish(trigger, "firing")
    d.publish({**trigger, "state": "resolved", "resolved_at": "2026-03-01T12:00:00Z"}, "resolved")
    firing, resolved = am.wait_for(2)
    assert firing["path"] == resolved["path"] == "/api/v2/alerts"
    assert firing["headers"]["Authorization"] == "Basic b3BzOnB3"  # ops:pw, taken out of the URL
    expected = {
        "labels": {"alertname": "p99_drift", "severity": "critical", "servelens_id": "t-1",
                   "deployment": "llama-70b-prod", "app_task_type": "rag"},
        "annotations": {"summary": FIRING["summary"], "dashboard_url": LINK,
                        "description": FIRING["summary"] + '\nevidence: {"p99_ms":1900,"baseline_p99_ms":1200,"p_value":0.001}'},
        "startsAt": "2026-03-01T10:00:00Z",
        "generatorURL": LINK,
    }
    [alert] = firing["body"]
    ends_at = datetime.fromisoformat(alert.pop("endsAt"))
    assert alert == expected
    assert ends_at > datetime.now(UTC)  # firing: valid until a future time
    assert resolved["body"] == [{**expected, "endsAt": "2026-03-01T12:00:00Z"}]
    assert until(lambda: list(d.stats()) == ["alertmanager:127.0.0.1"])  # no credentials in names


def test_alertmanager_keepalive_until_resolved(receivers, dispatcher) -> None:
    am = receivers()
    d = dispatcher({"type": "alertmanager", "url": am.url, "resend_interval": "100ms"})
    d.publish(FIRING, "firing")
    assert len(am.wait_for(3, timeout=3)) >= 3  # re-posted, so Alertmanager does not expire it
    d.publish(RESOLVED, "resolved")
    assert until(lambda: am.requests[-1]["body"][0]["endsAt"] == "2026-03-01T12:00:00Z")
    count = len(am.requests)
    time.sleep(0.35)
    assert len(am.requests) == count  # resolved: no more keepalives
    assert until(lambda: d.stats()["alertmanager:127.0.0.1"]["sent"] == 2)


def test_keepalives_stop_for_an_episode_another_process_resolved(receivers, dispatcher) -> None:
    """The scheduler passes the store's active episodes every tick: one resolved by another
    process's window (its "resolved" went out from there) is no longer re-posted here."""
    am = receivers()
    d = dispatcher({"type": "alertmanager", "url": am.url, "resend_interval": "100ms"})
    d.publish(FIRING, "firing")
    assert len(am.wait_for(2, timeout=3)) >= 2
    d.retain({FIRING["id"]})  # still active: still kept alive
    count = len(am.requests)
    assert until(lambda: len(am.requests) > count)
    d.retain(set())
    time.sleep(0.15)  # a keepalive already under way may still land
    count = len(am.requests)
    time.sleep(0.35)
    assert len(am.requests) == count


def test_restart_reposts_open_episodes_to_alertmanager_only(store, receivers, dispatcher) -> None:
    """After a restart the open episodes (read from the store) go to Alertmanager again,
    which expires what is not re-posted; a webhook already had its one message."""
    from servelens.analytics.triggers import engine, episodes

    started = datetime(2026, 3, 1, 10, tzinfo=UTC)

    def episode(kind: str, state: str) -> episodes.Episode:
        return episodes.Episode(
            id=f"{kind}-1", kind=kind, subject_key=f"service={kind}", subject={"service": kind}, state=state,
            severity="critical", started_at=started, detected_at=started + timedelta(hours=1),
            resolved_at=None if state == "active" else started + timedelta(hours=3), clear_since=None,
            clear_windows=0, summary=f"{kind} summary", evidence={"n": 1}, window_until=started + timedelta(hours=3))
    episodes.write(store, [episode("error_rate_spike", "active"), episode("retry_storm", "resolved")], "test")

    am, hook = receivers(), receivers()
    d = dispatcher({"type": "alertmanager", "url": am.url}, {"type": "webhook", "url": hook.url})
    d.restore(engine.active_triggers(store))
    [request] = am.wait_for(1)
    [alert] = request["body"]
    assert alert["labels"]["alertname"] == "error_rate_spike" and alert["labels"]["servelens_id"] == "error_rate_spike-1"
    assert datetime.fromisoformat(alert["endsAt"]) > datetime.now(UTC)
    time.sleep(0.3)
    assert hook.requests == [] and len(am.requests) == 1


def test_email_firing_and_resolved(smtp, dispatcher) -> None:
    d = dispatcher({"type": "email", "to": "oncall@example.com, ml@example.com", "smtp_host": "127.0.0.1",
                    "smtp_port": smtp.port, "smtp_from": "alerts@example.com"})
    d.publish(FIRING, "firing")
    d.publish(RESOLVED, "resolved")
    first, second = smtp.wait_for(2)
    assert first["from"] == "alerts@example.com"
    assert first["to"] == ["oncall@example.com", "ml@example.com"]
    msg = first["message"]
    assert msg["Subject"] == "[servelens] FIRING critical p99_drift on deployment=llama-70b-prod"
    assert msg["To"] == "oncall@example.com, ml@example.com"
    assert msg.get_content() == (
        "latency p99 1900 ms vs baseline 1200 ms; p50 flat\n\n"
        "Trigger:   p99_drift\nSubject:   deployment=llama-70b-prod\nSeverity:  critical\nState:     firing\n"
        "Started:   2026-03-01T10:00:00Z\nDetected:  2026-03-01T10:05:00Z\n"
        f"Dashboard: {LINK}\nID:        t-1\n\n"
        'Evidence:\n{\n  "baseline_p99_ms": 1200,\n  "p99_ms": 1900,\n  "p_value": 0.001\n}\n')
    reply = second["message"]
    assert reply["Subject"] == "[servelens] RESOLVED critical p99_drift on deployment=llama-70b-prod"
    assert reply["In-Reply-To"] == msg["Message-ID"] == "<t-1.firing@example.com>"
    assert "State:     resolved\n" in reply.get_content()
    assert "Resolved:  2026-03-01T12:00:00Z\n" in reply.get_content()


# --- delivery policy ---------------------------------------------------------------------

def test_min_severity_filters(receivers, dispatcher) -> None:
    every, critical = receivers(), receivers()
    d = dispatcher({"type": "webhook", "url": every.url, "name": "every"},
                   {"type": "webhook", "url": critical.url, "name": "critical", "min_severity": "critical"})
    d.publish(WARNING, "firing")
    d.publish(FIRING, "firing")
    every.wait_for(2)
    critical.wait_for(1)
    d.shutdown(2.0)  # drains: anything queued has been sent by now
    assert [b["id"] for b in every.bodies()] == ["t-2", "t-1"]
    assert [b["id"] for b in critical.bodies()] == ["t-1"]
    assert d.stats() == {"every": {"sent": 2}, "critical": {"sent": 1, "filtered": 1}}


def test_retries_on_503_then_delivers_once(receivers, dispatcher) -> None:
    hook = receivers([503, 503])
    d = dispatcher({"type": "webhook", "url": hook.url, **FAST})
    d.publish(FIRING, "firing")
    assert until(lambda: d.stats().get("webhook:127.0.0.1", {}).get("sent") == 1)
    d.shutdown(2.0)
    assert [r["status"] for r in hook.requests] == [503, 503, 200]  # exactly one delivery
    assert d.stats() == {"webhook:127.0.0.1": {"retried": 2, "sent": 1}}


def test_no_retry_on_400(receivers, dispatcher) -> None:
    hook = receivers([400])
    d = dispatcher({"type": "webhook", "url": hook.url, **FAST})
    d.publish(FIRING, "firing")
    assert until(lambda: d.stats().get("webhook:127.0.0.1", {}).get("failed") == 1)
    time.sleep(0.1)
    assert len(hook.requests) == 1
    assert d.stats() == {"webhook:127.0.0.1": {"failed": 1}}


@pytest.mark.parametrize("limits, most", [({"max_attempts": 3}, 3),
                                          ({"max_attempts": 1000, "retry_deadline": "300ms"}, 30)])
def test_retries_are_bounded(receivers, dispatcher, limits, most) -> None:
    hook = receivers(default=503)
    d = dispatcher({"type": "webhook", "url": hook.url, **FAST, **limits})
    started = time.monotonic()
    d.publish(FIRING, "firing")
    assert until(lambda: d.stats().get("webhook:127.0.0.1", {}).get("failed") == 1)
    assert time.monotonic() - started < 2.0
    attempts = len(hook.requests)
    time.sleep(0.2)
    assert len(hook.requests) == attempts  # stopped for good
    assert 2 <= attempts <= most
    assert d.stats()["webhook:127.0.0.1"] == {"retried": attempts - 1, "failed": 1}


def test_dead_sinks_block_neither_publish_nor_healthy_sink(receivers, dispatcher) -> None:
    healthy, hung = receivers(), receivers(default="hang")
    d = dispatcher({"type": "webhook", "url": closed_port_url(), "name": "refused", **FAST},
                   {"type": "webhook", "url": hung.url, "name": "hung", "timeout": "5s", "queue_size": 2},
                   {"type": "webhook", "url": healthy.url, "name": "healthy"})
    slowest = 0.0
    for i in range(10):
        started = time.perf_counter()
        d.publish({**FIRING, "id": f"t-{i}"}, "firing")
        slowest = max(slowest, time.perf_counter() - started)
        if i == 0:
            hung.wait_for(1)  # "hung" now holds its first message in flight
    assert slowest < 0.05
    assert len(healthy.wait_for(10, timeout=2)) == 10  # while "hung" is still stuck on its first
    assert len(hung.requests) == 1
    # "hung": 1 in flight + 2 queued; the other 7 overflowed its bounded queue.
    assert d.stats()["hung"] == {"dropped": 7}
    started = time.monotonic()
    d.shutdown(0.5)
    assert time.monotonic() - started < 1.5  # shutdown is bounded too
    assert d.stats()["hung"]["dropped"] == 9  # the queued ones, counted at shutdown
    assert d.stats()["healthy"] == {"sent": 10}
    refused = d.stats()["refused"]
    assert "sent" not in refused and refused["retried"] > 0


# --- configuration and `servelens alerts test` ---------------------------------------------

@pytest.mark.parametrize("sink, named", [
    ({"type": "webhook"}, "needs url"),
    ({"type": "email", "to": "a@example.com"}, "needs smtp_host"),
    ({"type": "email", "smtp_host": "mail"}, "needs to"),
    ({"type": "pager", "url": "http://x"}, "alerts.sinks.0.type"),
    ({"type": "webhook", "url": "http://x", "min_severity": "info"}, "alerts.sinks.0.min_severity"),
    ({"type": "slack", "url": "hooks.slack.com"}, "alerts.sinks.0.url"),
])
def test_config_names_the_bad_key(tmp_path: Path, sink, named) -> None:
    path = tmp_path / "servelens.yaml"
    path.write_text(json.dumps({"alerts": {"sinks": [sink]}}))  # JSON is YAML
    with pytest.raises(ConfigError, match=named):
        load(path)


def test_cli_alerts_test(tmp_path: Path, receivers, smtp, capsys) -> None:
    hook, slack, am = receivers(), receivers(), receivers()
    config = tmp_path / "servelens.yaml"
    sinks = [{"type": "webhook", "url": hook.url, "name": "hook", "min_severity": "critical"},
             {"type": "slack", "url": slack.url, "name": "slack"},
             {"type": "alertmanager", "url": am.url, "name": "am"},
             {"type": "email", "to": "oncall@example.com", "smtp_host": "127.0.0.1", "smtp_port": smtp.port,
              "name": "mail"}]
    config.write_text(json.dumps({"alerts": {"sinks": sinks, "dashboard_url": "http://dash"}}))
    assert cli.main(["alerts", "test", "--config", str(config)]) == 0
    assert capsys.readouterr().out.splitlines() == ["hook: ok", "slack: ok", "am: ok", "mail: ok"]
    [body] = hook.bodies()  # sent even below min_severity: it tests the sink
    assert body["kind"] == "servelens_test" and body["summary"].startswith("TEST")
    assert slack.bodies()[0]["text"].startswith("[servelens] FIRING warning servelens_test")
    assert am.bodies()[0][0]["labels"]["alertname"] == "servelens_test"
    assert smtp.wait_for(1)[0]["message"]["Subject"].startswith("[servelens] FIRING warning servelens_test")

    sinks.append({"type": "webhook", "url": closed_port_url(), "name": "dead", "timeout": "1s"})
    config.write_text(json.dumps({"alerts": {"sinks": sinks}}))
    assert cli.main(["alerts", "test", "--config", str(config)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[:4] == ["hook: ok", "slack: ok", "am: ok", "mail: ok"]
    assert lines[4].startswith("dead: unreachable")


def test_cli_alerts_test_without_sinks(tmp_path: Path, capsys) -> None:
    config = tmp_path / "servelens.yaml"
    config.write_text("alerts: {sinks: []}\n")
    assert cli.main(["alerts", "test", "--config", str(config)]) == 1
    assert "no alert sinks configured" in capsys.readouterr().err
