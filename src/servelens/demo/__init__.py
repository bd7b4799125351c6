"""Demo traffic: a simulated fleet that sends real OTLP spans and DCGM metrics."""
