"""`python -m servelens` is the `servelens` command."""

from servelens.app.cli import main

raise SystemExit(main())
