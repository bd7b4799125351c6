"""Receiving OTLP and scrapes, mapping them to rows, and writing them durably to the store."""
