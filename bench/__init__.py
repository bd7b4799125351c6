"""Benchmarks for servelens (`make bench` = `python -m bench`); figures go to BENCHMARKS.md."""
