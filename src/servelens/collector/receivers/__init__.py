"""The OTLP/gRPC and OTLP/HTTP receivers and the Prometheus scraper: bytes in, intake calls out."""
