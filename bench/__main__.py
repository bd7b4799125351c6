"""`python -m bench` (what `make bench` runs): ingest, analytics, then detection quality;
figures into BENCHMARKS.md.

`python -m bench ingest|analytics|detection [...]` runs one of them, passing the
remaining arguments on (`--quick`, `--no-write`, ...).
"""

import sys

from bench import analytics, detection, ingest

BENCHES = {"ingest": ingest.main, "analytics": analytics.main, "detection": detection.main}


def main(argv: list[str]) -> int:
    if argv and argv[0] in BENCHES:
        return BENCHES[argv[0]](argv[1:])
    return max(bench(argv) for bench in BENCHES.values())


sys.exit(main(sys.argv[1:]))
