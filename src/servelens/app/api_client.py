"""The JSON API of a running servelens, for commands that ask it rather than the store
(`servelens report --server URL`): the way to read an embedded store another process holds,
or a remote deployment, with an API token (dashboard.access)."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Mapping

TIMEOUT_S = 120.0  # a report over a long window may take a while; the server's own deadline is shorter


class ApiError(Exception):
    """The server refused or could not be reached; the message says which and why."""


def get_json(server: str, path: str, params: Mapping[str, Any], token: str | None = None,
             ca_file: str | None = None) -> Any:
    query = urllib.parse.urlencode({k: str(v) for k, v in params.items() if v not in (None, "")})
    url = f"{server.rstrip('/')}{path}" + (f"?{query}" if query else "")
    headers = {"Accept": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    context = ssl.create_default_context(cafile=ca_file) if ca_file else None
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=TIMEOUT_S,
                                    context=context) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        try:
            said = json.loads(exc.read()).get("error") or exc.reason
        except (ValueError, AttributeError):
            said = exc.reason
        hint = " (send an API token: --token or SERVELENS_TOKEN)" if exc.code == 401 and not token else ""
        raise ApiError(f"{url}: {exc.code} {said}{hint}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ApiError(f"{url}: {exc}") from None
