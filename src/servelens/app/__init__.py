"""The top floor: the command line and the processes it runs (collector, analytics, dashboard, all in one)."""
