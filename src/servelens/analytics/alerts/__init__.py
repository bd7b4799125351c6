"""Drift-alert delivery (SPEC 7): sinks, and the non-blocking dispatcher that feeds them."""

from servelens.analytics.alerts.dispatcher import Dispatcher, send_test
from servelens.analytics.alerts.sinks import Alert, DeliveryError, build_sinks

__all__ = ["Alert", "DeliveryError", "Dispatcher", "build_sinks", "send_test"]
