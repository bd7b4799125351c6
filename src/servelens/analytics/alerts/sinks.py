"""Alert sinks (SPEC 7): what each destination is sent, and one attempt at sending it.

A sink renders an Alert into its destination's format and makes exactly one attempt; it
raises DeliveryError saying whether a retry could help. Retries, queues and threads are
the dispatcher's business, so a sink stays a small, synchronous, testable class.
"""

from __future__ import annotations

import base64
import json
import re
import smtplib
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from email.utils import formatdate
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from servelens import __version__
from servelens.core.config import AlertSink

TRANSITIONS = ("firing", "resolved")
MAX_RETRY_AFTER_SECONDS = 300.0


class DeliveryError(Exception):
    """One attempt failed. `retryable`: a later attempt may succeed (network, 429, 5xx, SMTP 4xx)."""

    def __init__(self, message: str, retryable: bool, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.retry_after = retry_after


@dataclass(frozen=True)
class Alert:
    """A trigger (SPEC 5's object) at one transition, with the link its readers follow."""

    trigger: dict[str, Any]
    transition: str  # firing | resolved
    dashboard_url: str | None = None  # base URL of the dashboard

    @property
    def link(self) -> str | None:
        if not self.dashboard_url:
            return None
        return f"{self.dashboard_url.rstrip('/')}/triggers?id={quote(str(self.trigger.get('id', '')))}"

    @property
    def subject_text(self) -> str:
        subject = self.trigger.get("subject") or {}
        return ", ".join(f"{k}={v}" for k, v in subject.items()) or "-"

    @property
    def headline(self) -> str:
        t = self.trigger
        return f"{self.transition.upper()} {t.get('severity', '?')} {t.get('kind', '?')} on {self.subject_text}"


def iso(value: Any) -> str | None:
    """ISO-8601 UTC with Z; trigger times may arrive as strings or datetimes."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    return str(value)


def _now() -> datetime:
    return datetime.now(UTC)


def to_json(value: Any) -> bytes:
    return json.dumps(value, default=iso, separators=(",", ":")).encode()


class Sink:
    """Base: a named destination with a severity floor; subclasses render and send."""

    def __init__(self, config: AlertSink, name: str) -> None:
        self.config = config
        self.name = name
        self.min_severity = config.min_severity
        # Re-post interval for destinations that expire alerts (Alertmanager); None: send once.
        self.keepalive: float | None = None

    def send(self, alert: Alert, timeout: float) -> None:
        raise NotImplementedError


class HttpSink(Sink):
    """JSON over HTTP POST; subclasses supply render()."""

    def __init__(self, config: AlertSink, name: str) -> None:
        super().__init__(config, name)
        self.url, self.headers = _split_credentials(self.endpoint(config.url or ""))
        self.headers.update(config.headers)

    def endpoint(self, url: str) -> str:
        return url

    def render(self, alert: Alert) -> Any:
        raise NotImplementedError

    def send(self, alert: Alert, timeout: float) -> None:
        post_json(self.url, self.render(alert), self.headers, timeout)


class WebhookSink(HttpSink):
    """The trigger object itself, plus where to look and which transition this is."""

    def render(self, alert: Alert) -> dict[str, Any]:
        return {**alert.trigger, "dashboard_url": alert.link, "transition": alert.transition}


class SlackSink(HttpSink):
    """Slack-compatible incoming webhook: one concise line."""

    def render(self, alert: Alert) -> dict[str, str]:
        summary = alert.trigger.get("summary") or ""
        text = f"[servelens] {_slack_escape(alert.headline)}: {_slack_escape(summary)}"
        if alert.link:
            text += f" <{alert.link}|open in servelens>"
        return {"text": text}


class AlertmanagerSink(HttpSink):
    """Alertmanager v2 `POST /api/v2/alerts`: one alert whose endsAt makes it resolve."""

    def __init__(self, config: AlertSink, name: str) -> None:
        super().__init__(config, name)
        self.keepalive = config.resend_interval.total_seconds()

    def endpoint(self, url: str) -> str:
        return url if url.rstrip("/").endswith("/api/v2/alerts") else url.rstrip("/") + "/api/v2/alerts"

    def render(self, alert: Alert) -> list[dict[str, Any]]:
        t = alert.trigger
        labels = {"alertname": str(t.get("kind", "servelens")), "severity": str(t.get("severity", "")),
                  "servelens_id": str(t.get("id", ""))}
        for key, value in (t.get("subject") or {}).items():
            labels.setdefault(_label_name(key), str(value))  # never shadow the three above
        annotations = {"summary": str(t.get("summary", "")),
                       "description": f"{t.get('summary', '')}\nevidence: {to_json(t.get('evidence', {})).decode()}"}
        if alert.link:
            annotations["dashboard_url"] = alert.link
        if alert.transition == "resolved":
            ends_at = iso(t.get("resolved_at")) or iso(_now())
        else:
            # Like Prometheus: valid for a few resend intervals, so a dead servelens lets it expire.
            ends_at = iso(_now() + timedelta(seconds=4 * (self.keepalive or 60)))
        body: dict[str, Any] = {"labels": labels, "annotations": annotations,
                                "startsAt": iso(t.get("started_at") or t.get("detected_at")), "endsAt": ends_at}
        if alert.link:
            body["generatorURL"] = alert.link
        return [body]


class EmailSink(Sink):
    """Plain-text email over SMTP; the resolve message threads under the firing one."""

    def render(self, alert: Alert) -> EmailMessage:
        t = alert.trigger
        msg = EmailMessage()
        msg["Subject"] = header_text(f"[servelens] {alert.headline}")
        msg["From"] = header_text(self.config.smtp_from)
        msg["To"] = header_text(", ".join(self.config.to))
        msg["Date"] = formatdate(usegmt=True)
        domain = msg_id_part(self.config.smtp_from.rpartition("@")[2] or "servelens")
        key = msg_id_part(str(t.get("id", "alert")))
        first = f"<{key}.firing@{domain}>"
        if alert.transition == "firing":
            msg["Message-ID"] = first
        else:
            msg["Message-ID"] = f"<{key}.resolved@{domain}>"
            msg["In-Reply-To"] = msg["References"] = first
        msg.set_content(email_body(alert))
        return msg

    def send(self, alert: Alert, timeout: float) -> None:
        c = self.config
        message = self.render(alert)
        try:
            with smtplib.SMTP(c.smtp_host or "", c.smtp_port, timeout=timeout) as smtp:
                smtp.ehlo()
                if c.smtp_starttls or (c.smtp_starttls is None and smtp.has_extn("starttls")):
                    smtp.starttls()
                    smtp.ehlo()
                if c.smtp_username:
                    smtp.login(c.smtp_username, c.smtp_password or "")
                smtp.send_message(message)
        except smtplib.SMTPRecipientsRefused as exc:
            codes = [code for code, _ in exc.recipients.values()]
            raise DeliveryError(f"recipients refused: {codes}", retryable=any(400 <= c < 500 for c in codes)) from exc
        except smtplib.SMTPResponseException as exc:
            raise DeliveryError(f"SMTP {exc.smtp_code}: {exc.smtp_error!r}", retryable=400 <= exc.smtp_code < 500) from exc
        except smtplib.SMTPNotSupportedError as exc:  # e.g. STARTTLS required but not offered
            raise DeliveryError(str(exc), retryable=False) from exc
        except (smtplib.SMTPException, OSError) as exc:
            raise DeliveryError(f"SMTP: {exc}", retryable=True) from exc


# What str.splitlines() breaks on (and so the email package refuses in a header value,
# raising before anything is sent), and the other control characters.
_NOT_IN_HEADER = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]+")
_NOT_IN_MSG_ID = re.compile(r"[^A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+")


def header_text(value: str) -> str:
    """A header value built from data (a service name, a trigger id): each run of line breaks
    or control characters becomes one space, so a value can neither add a header nor stop
    the message from being sent."""
    return _NOT_IN_HEADER.sub(" ", value).strip()


def msg_id_part(value: str) -> str:
    """A Message-ID half (RFC 5322 dot-atom text): anything else becomes '-'."""
    return _NOT_IN_MSG_ID.sub("-", value).strip(".") or "alert"


def email_body(alert: Alert) -> str:
    t = alert.trigger
    rows = [("Trigger", t.get("kind")), ("Subject", alert.subject_text), ("Severity", t.get("severity")),
            ("State", alert.transition), ("Started", iso(t.get("started_at"))),
            ("Detected", iso(t.get("detected_at"))), ("Resolved", iso(t.get("resolved_at"))),
            ("Dashboard", alert.link), ("ID", t.get("id"))]
    lines = [str(t.get("summary", "")), ""]
    lines += [f"{label + ':':<11}{value}" for label, value in rows if value is not None]
    lines += ["", "Evidence:", json.dumps(t.get("evidence", {}), default=iso, indent=2, sort_keys=True)]
    return "\n".join(lines) + "\n"


SINK_CLASSES: dict[str, type[Sink]] = {
    "webhook": WebhookSink, "slack": SlackSink, "alertmanager": AlertmanagerSink, "email": EmailSink,
}


def build_sinks(configs: list[AlertSink]) -> list[Sink]:
    """One Sink per config entry, with unique names (type:host unless named; no URL secrets)."""
    sinks: list[Sink] = []
    seen: set[str] = set()
    for config in configs:
        base = config.name or f"{config.type}:{config.smtp_host if config.type == 'email' else urlsplit(config.url).hostname}"
        name, n = base, 1
        while name in seen:
            n += 1
            name = f"{base}#{n}"
        seen.add(name)
        sinks.append(SINK_CLASSES[config.type](config, name))
    return sinks


def post_json(url: str, body: Any, headers: dict[str, str], timeout: float) -> None:
    """One POST; maps every failure to DeliveryError (retry on network, 429 and 5xx only)."""
    request = urllib.request.Request(url, data=to_json(body), method="POST", headers={
        "Content-Type": "application/json", "User-Agent": f"servelens/{__version__}", **headers})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # configured URL
            response.read(65536)
    except urllib.error.HTTPError as exc:
        retryable = exc.code == 429 or exc.code >= 500
        raise DeliveryError(f"HTTP {exc.code} {exc.reason}", retryable,
                            _retry_after(exc.headers.get("Retry-After")) if retryable else None) from exc
    except (urllib.error.URLError, OSError) as exc:  # refused, DNS, timeout, reset
        raise DeliveryError(f"unreachable: {getattr(exc, 'reason', exc)}", retryable=True) from exc


def _retry_after(value: str | None) -> float | None:
    try:
        return min(max(float(value), 0.0), MAX_RETRY_AFTER_SECONDS) if value else None
    except ValueError:
        return None  # an HTTP date: ignore it, our own backoff applies


def _split_credentials(url: str) -> tuple[str, dict[str, str]]:
    """urllib ignores user:pass@ in URLs; turn it into a Basic Authorization header."""
    parts = urlsplit(url)
    if parts.username is None:
        return url, {}
    token = base64.b64encode(f"{parts.username}:{parts.password or ''}".encode()).decode()
    host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname or ""
    netloc = host + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc)), {"Authorization": f"Basic {token}"}


def _label_name(key: str) -> str:
    """Prometheus label names are [a-zA-Z_][a-zA-Z0-9_]*; subject keys may hold dots."""
    name = "".join(ch if ch.isascii() and (ch.isalnum() or ch == "_") else "_" for ch in key)
    return name if name and not name[0].isdigit() else f"_{name}"


def _slack_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
