"""The HTTP client the tools and the sandbox environment share, and the check of a tool's config keys.

One aiohttp session per tool and actor, opened on first use (it must be made inside the event loop).
Connection errors, 429 and 5xx are retried with back-off; timeouts are not (the call already used its
budget, and re-running code would double its effects).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


def parse_tool_config(config_class, kind: str, config: dict[str, Any]):
    """The config dataclass from a --tool_configs object, naming an unknown key in one line."""
    known = {f.name for f in dataclasses.fields(config_class)}
    unknown = sorted(set(config) - known - {"pool_size"})
    if unknown:
        raise ValueError(f"--tool_configs for {kind!r}: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")
    return config_class(**{k: v for k, v in config.items() if k in known})


class HttpClient:
    """One aiohttp session per tool and actor, opened on first use (it must be made inside the event loop)."""

    def __init__(self) -> None:
        self._session = None

    async def request(self, method: str, url: str, payload: Any, timeout: float, headers: dict, retries: int):
        """(status, body text); raises asyncio.TimeoutError or the last connection error."""
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession()
        attempt = 0
        while True:
            try:
                async with self._session.request(
                    method, url, json=payload, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout)
                ) as response:
                    text = await response.text()
                    if response.status not in RETRY_STATUSES or attempt >= retries:
                        return response.status, response.reason or "", text
            except aiohttp.ClientConnectionError:
                if attempt >= retries:
                    raise
            attempt += 1
            await asyncio.sleep(0.25 * 2**attempt)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
