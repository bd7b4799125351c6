"""Typed configuration: servelens.yaml + SERVELENS_* env vars + CLI flags (SPEC 1a).

Precedence, highest first: CLI flag > env var > file > default. pydantic-settings does
the merging and validation; a bad key or value fails at start with its dotted name.
"""

from __future__ import annotations

import json
import os
import re
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Literal, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator, model_validator
from pydantic_settings import (BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict,
                               YamlConfigSettingsSource)

from servelens.core import keys

DEFAULT_CONFIG_FILE = "servelens.yaml"
DEFAULT_DATA_DIR = ".servelens/data"

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)\s*$")
BUDGET_STAGES = frozenset({"queue", "prefill", "decode", "retrieval", "tool", "embedding", "network", "postprocess", "other", "total"})
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(value: Any) -> timedelta:
    """'200ms', '15s', '1h', '7d' (or a number of seconds) -> timedelta."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, (int, float)):
        return timedelta(seconds=value)
    match = _DURATION.match(str(value))
    if not match:
        raise ValueError(f"not a duration: {value!r} (use e.g. 200ms, 15s, 5m, 1h, 7d)")
    return timedelta(seconds=float(match.group(1)) * _UNIT_SECONDS[match.group(2)])


class _Strict(BaseModel):
    # Unknown keys are typos until proven otherwise: reject them by name.
    model_config = ConfigDict(extra="forbid")


class StoreConfig(_Strict):
    clickhouse_url: str | None = None  # None: chdb://<data_dir>
    database: str = "otel"
    retention_days: int = Field(30, ge=1)
    # A ClickHouse cluster (its name in the servers' remote_servers): the migrations create
    # replicated tables and Distributed tables over them on it (servelens.cluster_ddl).
    cluster: str | None = None

    @field_validator("clickhouse_url")
    @classmethod
    def _scheme(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^(chdb|https?)://", v):
            raise ValueError("must start with chdb://, http:// or https://")
        return v

    @field_validator("cluster")
    @classmethod
    def _cluster_name(cls, v: str | None) -> str | None:
        # It is spliced into ON CLUSTER and Distributed(...) as it is.
        if v is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v):
            raise ValueError("must be a plain identifier (letters, digits, _), as remote_servers names it")
        return v


class CollectorConfig(_Strict):
    max_request_bytes: int = Field(16 * 1024 * 1024, ge=1024)
    tokens: dict[str, str] = {}
    queue_size: int = Field(256, ge=1, description="batches waiting for the writer")
    batch_size: int = Field(65536, ge=1, description="rows per insert")
    # Group commit: a batch is whatever queued while the previous insert ran, plus what
    # arrives within flush_interval; batch_size caps it.
    flush_interval: timedelta = timedelta(milliseconds=5)
    store_retry: timedelta = timedelta(seconds=2)  # retry the store this long, then spool
    write_timeout: timedelta = timedelta(seconds=30)  # a request waits at most this long
    spool_max_bytes: int = Field(1024**3, ge=0, description="0 disables the spool")
    # When a request is answered 200: "stored" once its rows are committed in the store;
    # "spooled" once they are fsynced in the spool, used as a write-ahead log and inserted
    # from there in the background (export latency of a disk write, not of an insert).
    acknowledge: Literal["stored", "spooled"] = "spooled"
    # "spooled": after an insert that others queued behind, the next one short of batch_size
    # rests this long so that it fills (a lone request goes at once; pipeline.replay)
    spool_linger: timedelta = timedelta(milliseconds=200)
    # Who maps spans to otel_traces rows: "python" (collector.mapping.spans), or "engine":
    # ClickHouse parses the request's protobuf itself and a view maps it
    # (collector.mapping.engine_spans); "auto": the engine where the store can (embedded, or a
    # server of ClickHouse 25.6 or later), else Python; and with the engine, an insert of few
    # spans mapped in Python where that gives the same rows (collector.pipeline.sink).
    trace_mapping: Literal["auto", "python", "engine"] = "auto"

    _dur = field_validator("flush_interval", "store_retry", "write_timeout", "spool_linger",
                           mode="before")(parse_duration)

    @model_validator(mode="after")
    def _spool_for_wal(self) -> CollectorConfig:
        if self.acknowledge == "spooled" and not self.spool_max_bytes:
            raise ValueError('acknowledge "spooled" needs the spool: spool_max_bytes > 0')
        return self


class ScrapeTarget(_Strict):
    url: str
    interval: timedelta = timedelta(seconds=15)
    job: str | None = None  # the series' service.name (default "prometheus")
    _dur = field_validator("interval", mode="before")(parse_duration)


class ScrapeConfig(_Strict):
    targets: list[ScrapeTarget] = []


class AttributesConfig(_Strict):
    # The defaults are the semantic keys (core.keys), which the llm_requests view is rendered from.
    tenant: list[str] = list(keys.UNIT_KEYS["tenant"])
    feature: list[str] = list(keys.UNIT_KEYS["feature"])
    team: list[str] = list(keys.UNIT_KEYS["team"])


class ModelPrice(_Strict):
    """USD per million tokens. Unset optional prices fall back: cached input and cache
    writes to the input price, reasoning to the output price (analytics/pricing.py)."""

    model: str
    match: str | None = None
    input_per_mtok: float = Field(ge=0)
    output_per_mtok: float = Field(ge=0)
    cached_input_per_mtok: float | None = Field(None, ge=0)
    cache_write_per_mtok: float | None = Field(None, ge=0)
    reasoning_per_mtok: float | None = Field(None, ge=0)
    effective_from: datetime | None = None

    @field_validator("match")
    @classmethod
    def _regex(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                re.compile(v)
            except re.error as exc:
                raise ValueError(f"invalid regex: {exc}") from exc
        return v

    @field_validator("effective_from", mode="before")
    @classmethod
    def _date(cls, v: Any) -> Any:
        if isinstance(v, date) and not isinstance(v, datetime):
            return datetime(v.year, v.month, v.day, tzinfo=timezone.utc)
        return v

    @field_validator("effective_from")
    @classmethod
    def _utc(cls, v: datetime | None) -> datetime | None:
        if v is not None and v.tzinfo is None:
            v = v.replace(tzinfo=timezone.utc)
        return v


class PricingConfig(_Strict):
    models: list[ModelPrice] = []
    # What prices the models `models` does not: the genai-prices package's data, or nothing.
    catalog: Literal["genai-prices", "none"] = "genai-prices"


class GpuSelector(_Strict):
    hosts: list[str] | None = None
    count: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _one(self) -> GpuSelector:
        if (self.hosts is None) == (self.count is None):
            raise ValueError("give exactly one of hosts or count")
        return self


class CostWeights(_Strict):
    input: float = Field(1.0, ge=0)
    output: float = Field(1.0, ge=0)


class DeploymentConfig(_Strict):
    name: str
    gpus: GpuSelector
    gpu_hourly_usd: float = Field(ge=0)
    primary_model: str | None = None
    budgets: dict[str, timedelta] = {}
    # Busy GPU cost is shared among the deployment's requests by weighted tokens.
    cost_weights: CostWeights = CostWeights()

    @field_validator("budgets", mode="before")
    @classmethod
    def _budgets(cls, v: Any) -> Any:
        if not isinstance(v, dict):
            return v
        unknown = sorted(set(v) - BUDGET_STAGES)
        if unknown:
            raise ValueError(f"unknown budget stage(s) {unknown}; known: {sorted(BUDGET_STAGES)}")
        return {k: parse_duration(d) for k, d in v.items()}


class EvaluationConfig(_Strict):
    pass_threshold: float = 0.5


class QualityConfig(_Strict):
    evaluations: dict[str, EvaluationConfig] = {}
    length_classes: list[int] = [1000, 8000]
    # A result is matched to its request among the requests from this long before the start
    # of its hour (analytics/sources/results.py): the match reads those days, not the whole
    # table. A result that comes later than this counts in the totals, under no slice.
    evaluation_delay: timedelta = timedelta(days=3)
    _dur = field_validator("evaluation_delay", mode="before")(parse_duration)


class TriggersConfig(_Strict):
    """Re-evaluation triggers (SPEC 6): the settings every kind shares, and one section per
    kind (`triggers.<kind>.<field>`), validated by the config model its detector registers
    in TRIGGER_KINDS. Each kind names its test's level, the smallest change worth acting on,
    and its minimum samples: a test alone fires on trivial differences in big samples, a
    threshold alone on noise in small ones. The defaults keep a stable system quiet
    (diurnal swings and normal bursts included)."""

    model_config = ConfigDict(extra="allow")  # the kinds' sections: see _kinds

    class Budget(_Strict):
        """Kind `budget`'s forecast: the spend_budgets report reads it too, so it is shared."""

        # No forecast before this share of the period has passed: a morning's spend says
        # little about a month's.
        forecast_after: float = Field(0.1, gt=0, lt=1, description="share of the period elapsed")
        # The forecast extends the spend rate of this much of the period just past (a whole
        # day: the daily rhythm averages out).
        recent: timedelta = timedelta(days=1)
        _dur = field_validator("recent", mode="before")(parse_duration)

    window: timedelta = timedelta(hours=1)
    baseline: timedelta = timedelta(days=7)
    # low_utilization's thresholds are flat keys (`triggers.low_utilization: 0.3`), as they
    # always were.
    low_utilization: float = Field(0.30, ge=0, le=1)
    low_utilization_critical: float = Field(0.10, ge=0, le=1)
    low_utilization_min_samples: int = Field(20, ge=1)
    resolve_after: int = Field(2, ge=1, description="clear windows before an episode resolves")
    settle: timedelta = timedelta(minutes=2)  # late spans: evaluate a window this long after it ends
    catch_up: int = Field(24, ge=1, description="most missed windows evaluated per scheduler tick")
    # A subject short of its minimum in one window is judged over up to this many trailing
    # windows together (analytics/triggers/pooling.py): small deployments are watched too.
    pool_windows: int = Field(6, ge=1, le=48, description="most windows pooled to reach a test's minimum")
    budget: Budget = Budget()
    _dur = field_validator("window", "baseline", "settle", mode="before")(parse_duration)

    @model_validator(mode="after")
    def _window(self) -> TriggersConfig:
        if self.window <= timedelta(0) or self.baseline < self.window:
            raise ValueError("window must be positive and baseline at least one window")
        return self

    @model_validator(mode="after")
    def _kinds(self) -> TriggersConfig:
        # Every registered kind's section is validated (its defaults where none is given);
        # once the set is complete, a key that is no kind fails too. Sections of kinds not
        # registered yet are kept as given.
        extra = self.__pydantic_extra__  # a dict: extra is allowed
        kinds = TRIGGER_KINDS.assembled().model_validate(
            {k: TRIGGER_KINDS.decoded(k, v) for k, v in extra.items() if TRIGGER_KINDS.complete or k in TRIGGER_KINDS.models})
        extra.update({k: getattr(kinds, k) for k in TRIGGER_KINDS.models})
        return self

    def __getattr__(self, name: str) -> Any:
        model = TRIGGER_KINDS.models.get(name) if not name.startswith("_") else None
        if model is None:
            return super().__getattr__(name)  # type: ignore[misc]
        if not isinstance(self.model_extra.get(name), model):
            # Registered after these settings were built: the command line reads its config
            # before it imports the detectors.
            self.check()
        return self.model_extra[name]

    def check(self) -> None:
        """Validate the kinds' sections against the kinds registered now (what the engine
        does before it evaluates): ConfigError names every bad key, triggers.<kind>.<field>."""
        try:
            self._kinds()
        except ValidationError as exc:
            raise ConfigError(_describe(exc, None, ("triggers",))) from None


class TriggerKinds:
    """The trigger kinds' own config models, by kind: what `triggers.<kind>` holds.

    Each detector module registers its kind's model when it is imported
    (analytics.triggers.base.detector), and analytics.triggers.detectors marks the set
    complete once it has imported them all. Core cannot import analytics, so the section is
    assembled the other way round: TriggersConfig keeps what it was given for a kind and
    validates it with the model registered for it, at once if the kind is registered when
    the settings are built, else on first read.
    """

    def __init__(self) -> None:
        self.models: dict[str, type[BaseModel]] = {}
        self.complete = False
        self._assembled: tuple[tuple[Any, ...], type[BaseModel]] | None = None

    def register(self, kind: str, model: type[BaseModel]) -> None:
        if kind in TriggersConfig.model_fields:
            raise ValueError(f"trigger kind {kind!r}: triggers.{kind} is a shared setting")
        if self.models.get(kind, model) is not model:
            raise ValueError(f"trigger kind {kind!r} already has a config model")
        self.models[kind] = model

    def decoded(self, kind: str, section: Any) -> Any:
        """`section` with its JSON-encoded list and mapping values decoded: what an env var
        gives (SERVELENS_TRIGGERS__<KIND>__KEYS='["model"]'). The settings source decodes
        those for fields it knows, and a kind's fields are not known to it."""
        model = self.models.get(kind)
        if model is None or not isinstance(section, dict):
            return section
        out = dict(section)
        for name, value in section.items():
            field = model.model_fields.get(name)
            if field is not None and isinstance(value, str) and get_origin(field.annotation) in (list, dict):
                try:
                    out[name] = json.loads(value)
                except ValueError:
                    pass  # left as given: validation names it
        return out

    def assembled(self) -> type[BaseModel]:
        """One model with a field per kind, defaulting to the kind's defaults: a bad key is
        then named by its whole path. Built again when the kinds change."""
        key = tuple(self.models.items())
        if self._assembled is None or self._assembled[0] != key:
            fields: dict[str, Any] = {k: (m, Field(default_factory=m)) for k, m in key}
            self._assembled = key, create_model("TriggerKindsConfig", __base__=_Strict, **fields)
        return self._assembled[1]


TRIGGER_KINDS = TriggerKinds()


class TriggerKindConfig(_Strict):
    """What a trigger kind's own config model derives from: unknown keys fail by name."""


SINK_TYPES = ("webhook", "slack", "alertmanager", "email")
ALERT_SEVERITIES = ("warning", "critical")  # ascending: min_severity keeps this one and those after it


class AlertSink(_Strict):
    """One alert destination (SPEC 7). HTTP sinks need `url`; email needs `to` and `smtp_host`."""

    type: str
    name: str | None = None  # label in logs, metrics and `alerts test` (default: type:host)
    url: str | None = None
    to: list[str] = []  # email recipients; "a@x, b@y" is accepted too
    min_severity: str = "warning"
    headers: dict[str, str] = {}  # extra HTTP headers, e.g. Authorization
    timeout: timedelta = timedelta(seconds=10)  # one attempt
    max_attempts: int = Field(5, ge=1)
    retry_deadline: timedelta = timedelta(minutes=2)  # one message gives up after this long
    backoff: timedelta = timedelta(milliseconds=500)  # first retry delay, doubled each time (with jitter)
    queue_size: int = Field(1000, ge=1)  # messages waiting for this sink; more are dropped (counted)
    # Alertmanager forgets an alert at its endsAt, so active alerts are re-posted this often.
    resend_interval: timedelta = timedelta(minutes=1)
    smtp_host: str | None = None
    smtp_port: int = Field(25, ge=1, le=65535)
    smtp_from: str = "servelens@localhost"
    smtp_username: str | None = None
    smtp_password: str | None = None
    smtp_starttls: bool | None = None  # None: when the server offers it; True: required; False: never

    _dur = field_validator("timeout", "retry_deadline", "backoff", "resend_interval", mode="before")(parse_duration)

    @field_validator("type")
    @classmethod
    def _type(cls, v: str) -> str:
        if v not in SINK_TYPES:
            raise ValueError(f"unknown sink type {v!r}; known: {', '.join(SINK_TYPES)}")
        return v

    @field_validator("min_severity")
    @classmethod
    def _severity(cls, v: str) -> str:
        if v not in ALERT_SEVERITIES:
            raise ValueError(f"unknown severity {v!r}; known: {', '.join(ALERT_SEVERITIES)}")
        return v

    @field_validator("to", mode="before")
    @classmethod
    def _recipients(cls, v: Any) -> Any:
        return [a.strip() for a in v.split(",") if a.strip()] if isinstance(v, str) else v

    @field_validator("url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^https?://[^/\s]+", v):
            raise ValueError("must be an http:// or https:// URL")
        return v

    @model_validator(mode="after")
    def _required(self) -> AlertSink:
        if self.type == "email":
            missing = [k for k, v in (("to", self.to), ("smtp_host", self.smtp_host)) if not v]
            if missing:
                raise ValueError(f"an email sink needs {' and '.join(missing)}")
        elif not self.url:
            raise ValueError(f"a {self.type} sink needs url")
        return self


class AlertsConfig(_Strict):
    sinks: list[AlertSink] = []
    # Base URL for links in alerts, as their readers reach it; public_url, when set, wins
    # (default http://<host>:<ui-port>/, a wildcard host named by this machine's hostname).
    dashboard_url: str | None = None


class AnalyticsConfig(_Strict):
    interval: timedelta = timedelta(seconds=60)
    # Percentiles of windows with at most this many requests come exactly from raw rows;
    # larger ones from the rollups' sketches, within 1 % (analytics/sources/rollups.py).
    exact_quantiles_up_to: int = Field(200_000, ge=0)
    use_rollups: bool = True  # false: every report reads raw rows (to compare, or to rule them out)
    _dur = field_validator("interval", mode="before")(parse_duration)


class DashboardConfig(_Strict):
    # Whether `servelens dashboard` (no analytics role in its process) runs the report jobs
    # and evaluates triggers on analytics.interval, so its Triggers page fills:
    #   auto  while no `servelens analytics` (or `up`) on the same store is alive: it stands
    #         by while one is, takes over when it stops (its heartbeat, analytics.leases)
    #   on    always, as an analytics.leases of its own
    #   off   never (a read-only dashboard)
    # Either way each window is evaluated once per store (the lease in analytics_leases),
    # so two processes never announce one transition twice. Give the dashboard the same
    # alerts.sinks as the analytics process: the windows it evaluates alert from it.
    evaluate_triggers: Literal["auto", "on", "off"] = "auto"
    # Page refreshes' answers are shared by every tab (dashboard/results_cache.py): served as
    # they are while younger than cache_fresh, up to cache_max_age old while a new one is
    # computed in the background; the Overview's default view is kept computed.
    # cache_max_age 0: every refresh computes its own answer.
    cache_fresh: timedelta = timedelta(seconds=10)
    cache_max_age: timedelta = timedelta(seconds=60)
    _dur = field_validator("cache_fresh", "cache_max_age", mode="before")(parse_duration)

    @model_validator(mode="after")
    def _cache(self) -> DashboardConfig:
        if self.cache_max_age and self.cache_fresh > self.cache_max_age:
            raise ValueError("cache_fresh must not exceed cache_max_age")
        return self


class UserConfig(_Strict):
    """A user declared in the file (others are added with `servelens users add`)."""

    name: str = Field(min_length=1, max_length=128)
    password_hash: str = Field(min_length=1)  # argon2id, as `servelens users hash` prints it
    role: Literal["admin", "viewer", "tenant"]
    tenants: list[str] = []  # role tenant: the tenants whose numbers this user reads

    @model_validator(mode="after")
    def _tenants(self) -> UserConfig:
        if (self.role == "tenant") != bool(self.tenants):
            raise ValueError("role tenant needs tenants; other roles take none")
        return self


class OidcConfig(_Strict):
    """Single sign-on through an OpenID Connect provider (SPEC 9). A signed-in person's role
    comes from `role_claim` (a string or a list of them) through `roles`; failing that,
    `tenant_claim` makes them a tenant viewer of the tenants it names; failing both, the
    sign-in is refused."""

    issuer: str  # its /.well-known/openid-configuration is read at the first sign-in (dashboard.oidc)
    client_id: str
    client_secret_env: str = "SERVELENS_OIDC_CLIENT_SECRET"  # the env var holding the secret
    scopes: list[str] = ["openid", "profile", "email"]
    name_claim: str = "email"  # what the audit log and the top bar call them (else `sub`)
    role_claim: str | None = None
    roles: dict[str, Literal["admin", "viewer"]] = {}
    tenant_claim: str | None = None
    label: str = "Sign in with single sign-on"  # the sign-in page's button

    @field_validator("issuer")
    @classmethod
    def _issuer(cls, v: str) -> str:
        if not re.match(r"^https?://[^/\s]+", v):
            raise ValueError("must be an http:// or https:// URL")
        return v.rstrip("/")


class AuthConfig(_Strict):
    """Sign-in, roles and API tokens (SPEC 9). Access control is on when any user exists
    (here or added with `servelens users add`) or the dashboard is bound to a non-loopback
    address; on loopback with no users the dashboard is open (the demo)."""

    users: list[UserConfig] = []
    oidc: OidcConfig | None = None
    # Host names the dashboard answers besides the bound address, localhost and
    # public_url's host (a request naming any other is refused: DNS rebinding). "*": any.
    allowed_hosts: list[str] = []
    # The address of a reverse proxy in front of the dashboard: its X-Forwarded-For and
    # X-Forwarded-Proto name the client (sign-in limits per address, the audit log) and
    # the scheme. Unset, those headers are dropped (a client could forge them).
    trusted_proxy: str | None = None
    session_lifetime: timedelta = timedelta(hours=12)
    # After this many wrong passwords for one user name within lockout, sign-in for that
    # name is refused until lockout has passed since the last failure.
    max_failed_signins: int = Field(5, ge=1)
    lockout: timedelta = timedelta(minutes=15)

    _dur = field_validator("session_lifetime", "lockout", mode="before")(parse_duration)

    @field_validator("users")
    @classmethod
    def _unique(cls, v: list[UserConfig]) -> list[UserConfig]:
        names = [u.name for u in v]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"user names must be unique; repeated: {repeated}")
        return v


class GpusConfig(_Strict):  # busy time; auto: DCGM_FI_PROF_GR_ENGINE_ACTIVE where reported, else DCGM_FI_DEV_GPU_UTIL
    busy_metric: Literal["auto", "gr_engine_active", "gpu_util"] = "auto"


class SpendBudget(_Strict):
    """A spend ceiling per business unit and calendar period (UTC): trigger kind `budget`."""

    by: Literal["tenant", "feature", "team"]
    key: str | None = None  # None: every value of `by` seen in the period, each on its own
    usd: float = Field(gt=0)
    period: Literal["day", "week", "month"] = "month"  # a week starts on Monday


class AutoscalingDefaults(_Strict):
    """plan.autoscaling: the policy a replay's autoscaling what-if uses where it names no
    value of its own (analytics.plan.autoscaler.Autoscaling; `name=value` in the what-if
    overrides each)."""

    target_utilization: float = Field(0.7, gt=0, le=1)
    metric: Literal["concurrency", "busy"] = "concurrency"
    interval: timedelta = timedelta(seconds=15)  # how often the policy decides
    scale_up_lag: timedelta = timedelta(seconds=120)  # from a decision to the replica ordered
    cold_start: timedelta = timedelta(seconds=90)  # from ordered to serving
    scale_down_delay: timedelta = timedelta(seconds=300)
    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(16, ge=1)
    scale_to_zero: bool = False
    _dur = field_validator("interval", "scale_up_lag", "cold_start", "scale_down_delay", mode="before")(parse_duration)

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingDefaults:
        if self.interval <= timedelta(0):
            raise ValueError("interval must be > 0")
        if self.min_replicas < (0 if self.scale_to_zero else 1):
            raise ValueError("min_replicas must be >= 1 (0 only with scale_to_zero)")
        if self.max_replicas < self.min_replicas:
            raise ValueError("max_replicas must be >= min_replicas")
        return self


class PlanConfig(_Strict):
    autoscaling: AutoscalingDefaults = AutoscalingDefaults()
    # A replay holds its window's requests in memory, ~0.3 KiB each while it runs (BENCHMARKS.md,
    # "Capacity planning: Tier B replay"): 5 M is a week at ~8 req/s; a week at 50 req/s is 30 M.
    replay_max_requests: int = Field(5_000_000, ge=1)


class ContextConfig(_Strict):
    """Context economics (the `context` report): where a prompt's input tokens go.

    `parts`: a part of the prompt -> the span attributes that carry its token count, first
    present wins (an application that counts its own context states it exactly; requests
    without them are estimated from the captured messages). `size_bounds`: the input-token
    edges of the context-size classes that latency and pass rate are shown by."""

    parts: dict[str, list[str]] = {
        "system": ["app.context.system_tokens"],
        "history": ["app.context.history_tokens"],
        "tool_results": ["app.context.tool_tokens"],
        "retrieved": ["app.context.retrieved_tokens"],
    }
    size_bounds: list[int] = [1000, 4000, 16000, 64000]

    @field_validator("parts")
    @classmethod
    def _parts(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        if any(not name or name == "other" for name in v):
            raise ValueError("a part needs a name, and 'other' is the remainder's")
        if any(not keys or any(not k for k in keys) for keys in v.values()):
            raise ValueError("each part needs at least one attribute key")
        return v

    @field_validator("size_bounds")
    @classmethod
    def _bounds(cls, v: list[int]) -> list[int]:
        if not v or any(b <= 0 for b in v) or any(b >= c for b, c in zip(v, v[1:])):
            raise ValueError("size_bounds: positive and increasing")
        return v


class SloConfig(_Strict):
    """A request SLO (trigger kind `slo_burn`, the `slo` report): the share of requests of
    its service / deployment that succeed (and, with latency_under, finish within it)."""

    name: str = Field(min_length=1)
    service: str | None = None
    deployment: str | None = None
    objective: float = Field(gt=0, lt=1)
    latency_under: timedelta | None = None
    period: timedelta = timedelta(days=30)

    @field_validator("latency_under", "period", mode="before")
    @classmethod
    def _duration(cls, v: Any) -> Any:
        return None if v is None else parse_duration(v)

    @model_validator(mode="after")
    def _positive(self) -> SloConfig:
        if self.period <= timedelta(0) or (self.latency_under is not None and self.latency_under <= timedelta(0)):
            raise ValueError("period and latency_under must be positive")
        return self


class Settings(BaseSettings):
    """The whole configuration. Top-level fields are the common CLI options."""

    model_config = SettingsConfigDict(
        env_prefix="SERVELENS_",
        env_nested_delimiter="__",
        extra="forbid",
        validate_default=True,
    )

    host: str = "127.0.0.1"
    otlp_grpc_port: int = Field(4317, ge=0, le=65535)
    otlp_http_port: int = Field(4318, ge=0, le=65535)
    ui_port: int = Field(8050, ge=0, le=65535)
    data_dir: Path = Path(DEFAULT_DATA_DIR)
    clickhouse_url: str | None = None  # shorthand for store.clickhouse_url (--clickhouse-url)
    # The dashboard's base URL as its readers reach it (proxy, --host 0.0.0.0): alert links
    # and the printed URL. Wins over alerts.dashboard_url.
    public_url: str | None = None
    # TLS for the dashboard, OTLP/HTTP and OTLP/gRPC alike (PEM files; core.tls). Both or neither.
    tls_cert: Path | None = None
    tls_key: Path | None = None

    store: StoreConfig = StoreConfig()
    collector: CollectorConfig = CollectorConfig()
    scrape: ScrapeConfig = ScrapeConfig()
    attributes: AttributesConfig = AttributesConfig()
    pricing: PricingConfig = PricingConfig()
    deployments: list[DeploymentConfig] = []
    quality: QualityConfig = QualityConfig()
    triggers: TriggersConfig = Field(default_factory=TriggersConfig)  # per instance: kinds fill it
    alerts: AlertsConfig = AlertsConfig()
    analytics: AnalyticsConfig = AnalyticsConfig()
    dashboard: DashboardConfig = DashboardConfig()
    gpus: GpusConfig = GpusConfig()
    auth: AuthConfig = AuthConfig()
    spend_budgets: list[SpendBudget] = []
    slos: list[SloConfig] = []
    plan: PlanConfig = PlanConfig()
    context: ContextConfig = ContextConfig()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, env_settings  # the file comes in through load()

    @field_validator("slos")
    @classmethod
    def _slo_names(cls, v: list[SloConfig]) -> list[SloConfig]:
        names = [s.name for s in v]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:  # a name is the SLO's identity: its episodes, its report row
            raise ValueError(f"SLO names must be unique; repeated: {repeated}")
        return v

    @model_validator(mode="after")
    def _tls_pair(self) -> Settings:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together: give both or neither")
        return self

    def tls_context(self) -> Any:
        """The servers' ssl.SSLContext, or None without TLS; raises ConfigError on a bad file."""
        if self.tls_cert is None or self.tls_key is None:
            return None
        from servelens.core.tls import TlsError, server_context

        try:
            return server_context(self.tls_cert, self.tls_key)
        except TlsError as exc:
            raise ConfigError(str(exc)) from None

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^https?://[^/\s]+", v):
            raise ValueError("must be an http:// or https:// URL")
        return v

    @property
    def link_base(self) -> str | None:
        """The configured dashboard URL: public_url, else alerts.dashboard_url (older configs)."""
        return self.public_url or self.alerts.dashboard_url

    @property
    def store_url(self) -> str:
        """The ClickHouse URL in force: --clickhouse-url, else store.clickhouse_url, else chdb://<data-dir>."""
        return self.clickhouse_url or self.store.clickhouse_url or f"chdb://{self.data_dir}"

    @property
    def spool_dir(self) -> Path:
        return self.data_dir / "spool"

    def deployment(self, name: str) -> DeploymentConfig | None:
        return next((d for d in self.deployments if d.name == name), None)


class ConfigError(Exception):
    """A configuration that cannot start; the message names every bad key."""


def load(config_file: str | os.PathLike[str] | None = None, **overrides: Any) -> Settings:
    """Build Settings from file (explicit, else ./servelens.yaml if present), env and overrides.

    `overrides` are CLI flags; None values mean "not given" and are ignored.
    """
    path = Path(config_file) if config_file else Path(DEFAULT_CONFIG_FILE)
    if config_file and not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    flags = {k: v for k, v in overrides.items() if v is not None}
    try:
        values = YamlConfigSettingsSource(Settings, yaml_file=path)() if path.is_file() else {}
        # Precedence in one place: flags over env over file (Settings reads env again, under
        # its arguments: the same values).
        return Settings(**_merged(_merged(values, EnvSettingsSource(Settings)()), flags))
    except ValidationError as exc:
        raise ConfigError(_describe(exc, path if path.is_file() else None)) from None
    except Exception as exc:  # YAML syntax errors surface here
        raise ConfigError(f"cannot read config {path}: {exc}") from None


def _merged(low: dict[str, Any], high: dict[str, Any]) -> dict[str, Any]:
    """`high` over `low`, mappings merged key by key (a file's section plus one env var)."""
    out = dict(low)
    for key, value in high.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _describe(exc: ValidationError, path: Path | None, within: tuple[str, ...] = ()) -> str:
    where = f" in {path}" if path else ""
    lines = [f"invalid configuration{where}:"]
    for err in exc.errors():
        key = ".".join(str(p) for p in (*within, *err["loc"]))
        lines.append(f"  {key}: {err['msg']}")
    return "\n".join(lines)
