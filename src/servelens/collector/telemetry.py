"""The collector's own metrics (Prometheus), one registry per running collector."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


class SelfMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.accepted = Counter("servelens_receiver_accepted_items", "Items (spans, points, log records) acknowledged",
                                ["signal", "transport"], registry=self.registry)
        self.rejected = Counter("servelens_receiver_rejected_items", "Items rejected as invalid (partial success)",
                                ["signal", "transport"], registry=self.registry)
        self.refused = Counter("servelens_receiver_refused_requests", "Requests refused (malformed, too large, busy)",
                               ["signal", "transport", "reason"], registry=self.registry)
        self.queue_depth = Gauge("servelens_writer_queue_depth", "Requests waiting for the writer",
                                 registry=self.registry)
        self.written = Counter("servelens_writer_rows", "Rows committed to the store", ["table"],
                               registry=self.registry)
        self.write_errors = Counter("servelens_writer_errors", "Failed inserts (retried)", ["table"],
                                    registry=self.registry)
        self.write_seconds = Histogram("servelens_writer_insert_seconds", "Insert latency", ["table"],
                                       registry=self.registry,
                                       buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))

        self.spool_bytes = Gauge("servelens_spool_bytes", "Bytes of acknowledged batches waiting in the spool",
                                 registry=self.registry)
        self.spool_batches = Gauge("servelens_spool_batches", "Batches waiting in the spool", registry=self.registry)
        self.spool_full = Counter("servelens_spool_full", "Times a batch was refused because the spool was full",
                                  registry=self.registry)
        self.quarantined = Counter("servelens_spool_quarantined_batches",
                                   "Acknowledged batches whose refused rows were set aside in spool/quarantine",
                                   registry=self.registry)
        self.rows_refused = Counter("servelens_writer_refused_rows",
                                    "Rows the store refused on their own (answered as rejected, or quarantined)",
                                    ["table"], registry=self.registry)
        self.replayed = Counter("servelens_spool_replayed_batches", "Spooled batches replayed into the store",
                                registry=self.registry)

        self.scrapes = Counter("servelens_scrapes", "Scrapes of Prometheus targets by result", ["target", "result"],
                               registry=self.registry)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def snapshot(self) -> dict[str, float]:
        """Flat {name{labels}: value} of the counters, for the health endpoint and tests."""
        out: dict[str, float] = {}
        for family in self.registry.collect():
            for sample in family.samples:
                if sample.name.endswith(("_created", "_bucket")):
                    continue
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
        return out
