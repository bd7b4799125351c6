"""`python -m bench` (what `make bench` runs): the ingest benchmark, figures into BENCHMARKS.md."""

import sys

from bench.ingest import main

sys.exit(main())
