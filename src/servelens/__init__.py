"""servelens: observability and FinOps analytics for AI serving."""

__version__ = "0.1.0"
