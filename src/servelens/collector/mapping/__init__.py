"""Pure mapping from decoded OTLP and Prometheus text to table rows (the dialects live here)."""
