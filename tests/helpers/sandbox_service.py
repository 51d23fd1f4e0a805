"""Our code service (code_server) with bash, for the generic_sandbox tests: started on a free port, its URL
yielded; the test is skipped where bash cannot run in it (its kernel sandbox layers need root)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest


@contextmanager
def bash_code_service() -> Iterator[str]:
    from code_server import code_server

    with code_server() as (server, url):
        if not server.executor.bash_ready:
            pytest.skip("bash in the code service needs root (its kernel sandbox layers)")
        yield url
