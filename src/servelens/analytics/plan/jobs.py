"""Long answers as jobs (SPEC 5 `GET /api/v1/plan/replay` → `{"job": id}`, then
`GET /api/v1/plan/jobs/<id>`): a replay of a week takes minutes, longer than a request
should wait.

Jobs run in this process, one at a time (a replay uses a whole core; the collector and
the dashboard need the other), each with its progress (0..1), its result or its error.
A job is kept for `keep` finished jobs, then forgotten; a process restart forgets them all
(the caller starts it again).
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

from servelens.analytics.query import QueryError
from servelens.core import priority


class Busy(RuntimeError):
    """Another job is running; the caller may try again later."""


@dataclass
class Job:
    id: str
    kind: str
    params: dict[str, Any]
    state: str = "running"  # running | done | failed
    progress: float = 0.0
    started_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    result: Any = None
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out = {"job": self.id, "kind": self.kind, "params": self.params, "state": self.state,
               "progress": round(self.progress, 4), "started_at": self.started_at, "finished_at": self.finished_at}
        if self.state == "done":
            out["result"] = self.result
        if self.state == "failed":
            out["error"] = self.error
        return out


class Jobs:
    def __init__(self, keep: int = 32) -> None:
        self._jobs: OrderedDict[str, Job] = OrderedDict()
        self._lock = threading.Lock()
        self._keep = keep
        self._seq = itertools.count(1)

    def start(self, kind: str, params: dict[str, Any], work: Callable[[Callable[[float], None]], Any]) -> Job:
        """Run `work(progress)` in a thread; raises Busy while another job runs."""
        with self._lock:
            if any(j.state == "running" for j in self._jobs.values()):
                raise Busy("a replay is running; try again when it is done")
            job = Job(f"{next(self._seq)}-{uuid.uuid4().hex[:8]}", kind, params)
            self._jobs[job.id] = job
            finished = [k for k, j in self._jobs.items() if j.state != "running"]
            for k in finished[:max(0, len(finished) - self._keep)]:
                del self._jobs[k]

        def progress(fraction: float) -> None:
            job.progress = min(1.0, max(job.progress, fraction))

        def run() -> None:
            priority.lower_this_thread()  # a replay runs for minutes: pages and ingest first
            try:
                job.result = work(progress)
                job.progress, job.state = 1.0, "done"
            except QueryError as exc:
                job.error, job.state = str(exc), "failed"
            except Exception as exc:  # noqa: BLE001 - the job reports it; the process goes on
                job.error, job.state = f"{type(exc).__name__}: {exc}", "failed"
            finally:
                job.finished_at = time.time()

        threading.Thread(target=run, name=f"plan-{kind}", daemon=True).start()
        return job

    def get(self, job_id: str) -> Job | None:
        return self._jobs.get(job_id)
