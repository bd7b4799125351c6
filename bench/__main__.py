"""`python -m bench` (what `make bench` runs): ingest, then analytics; figures into BENCHMARKS.md.

`python -m bench ingest [...]` or `python -m bench analytics [...]` runs one of them,
passing the remaining arguments on (`--quick`, `--no-write`, ...).
"""

import sys

from bench import analytics, ingest

BENCHES = {"ingest": ingest.main, "analytics": analytics.main}


def main(argv: list[str]) -> int:
    if argv and argv[0] in BENCHES:
        return BENCHES[argv[0]](argv[1:])
    return max(bench(argv) for bench in BENCHES.values())


sys.exit(main(sys.argv[1:]))
