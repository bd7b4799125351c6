"""Email headers built from data (issue 14): a service name or trigger id holding CR/LF, or
other line breaks, still gets its alert emailed, as one Subject line and no extra header.
Delivered by the real dispatcher to the small SMTP receiver of test_alerts on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from servelens.analytics.alerts import Dispatcher
from tests.analytics.test_alerts import FIRING, SmtpReceiver, until

HOSTILE = "checkout\r\nBcc: attacker@example.com\r\n\r\nbody"


@pytest.fixture
def smtp() -> Iterator[SmtpReceiver]:
    server = SmtpReceiver()
    yield server
    server.close()


@pytest.fixture
def email_dispatcher(make_settings, smtp: SmtpReceiver) -> Iterator[Dispatcher]:
    sink = {"type": "email", "to": "oncall@example.com", "smtp_host": "127.0.0.1", "smtp_port": smtp.port,
            "smtp_from": "alerts@example.com", "backoff": "10ms", "timeout": "2s"}
    d = Dispatcher(make_settings(alerts={"sinks": [sink]}), "http://dash.example:8050/")
    d.start()
    yield d
    d.shutdown(1.0)


@pytest.mark.parametrize("service", [HOSTILE, "a\nb", "a\rb", "a\u2028b\x85c\x0bd\x00e"],
                         ids=["crlf-injection", "lf", "cr", "other-breaks"])
def test_line_breaks_in_data_do_not_suppress_the_email(email_dispatcher, smtp, service: str) -> None:
    trigger = {**FIRING, "id": "t-9\r\nX-Evil: 1", "subject": {"service": service}}
    email_dispatcher.publish(trigger, "firing")
    email_dispatcher.publish({**trigger, "state": "resolved", "resolved_at": "2026-03-01T12:00:00Z"}, "resolved")
    firing, resolved = smtp.wait_for(2)

    assert firing["to"] == ["oncall@example.com"]  # no recipient smuggled in
    msg = firing["message"]
    flat = " ".join(service.replace("\x00", " ").split())
    assert msg["Subject"] == f"[servelens] FIRING critical p99_drift on service={flat}"
    assert "Bcc" not in msg and "X-Evil" not in msg
    assert msg["Message-ID"] == "<t-9-X-Evil-1.firing@example.com>"
    assert resolved["message"]["In-Reply-To"] == msg["Message-ID"]  # still threads under it
    assert until(lambda: email_dispatcher.stats() == {"email:127.0.0.1": {"sent": 2}})
