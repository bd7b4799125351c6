"""Semantic keys shared by Python and SQL: the business units and where they are read from.

A business unit (tenant, feature, team; and the end user) is the first non-empty value
among its attribute keys, span attributes before resource attributes, in the order
declared here. The llm_requests view (migrations 0014, 0021: rendered from
collector.mapping.dialects) derives its Tenant / Feature / Team / UserId columns by these
keys, `attributes:` (core.config) defaults to them, and a report over a unit reads the
typed column exactly when its configured keys are these (analytics.sql.business_unit);
tests/analytics/test_sql_fragments.py reads the live view back and checks the order.

A key is an attribute, or `<JSON attribute>.<key inside it>` (OpenInference's
metadata); a JSON-encoded string value (Langfuse's trace metadata) is decoded. The Vercel
AI SDK carries the app's telemetry metadata as `ai.telemetry.metadata.<key>` (AI SDK 6 and
before) or its context as `ai.settings.context.<key>` (AI SDK 7), under the app's own names:
tenant, feature and team as here, the user and session as `userId` and `sessionId`.
"""

from __future__ import annotations

# Configurable under `attributes:` (report keys).
UNITS = ("tenant", "feature", "team")

UNIT_KEYS: dict[str, tuple[str, ...]] = {
    "tenant": ("app.tenant", "tenant.id", "tenant", "traceloop.association.properties.tenant",
               "langfuse.trace.metadata.tenant", "metadata.tenant", "litellm.metadata.tenant",
               "ai.telemetry.metadata.tenant", "ai.settings.context.tenant"),
    "feature": ("app.feature", "feature", "traceloop.association.properties.feature",
                "langfuse.trace.metadata.feature", "metadata.feature", "litellm.metadata.feature",
                "ai.telemetry.metadata.feature", "ai.settings.context.feature"),
    "team": ("app.team", "team", "traceloop.association.properties.team", "langfuse.trace.metadata.team",
             "metadata.team", "litellm.metadata.team", "ai.telemetry.metadata.team", "ai.settings.context.team"),
    "user": ("user.id", "enduser.id", "traceloop.association.properties.user_id", "llm.user",
             "ai.telemetry.metadata.userId", "ai.settings.context.userId"),
}

# The llm_requests column that holds each unit as the default keys resolve it.
UNIT_COLUMNS = {"tenant": "Tenant", "feature": "Feature", "team": "Team", "user": "UserId"}

# Where a bearer token's tenant is written on a span (collector.mapping.spans, 0012).
TENANT_ATTRIBUTE = "app.tenant"
