"""Shared fixtures: the embedded tiny model (built once per machine, cached)."""

import pytest


@pytest.fixture(scope="session")
def model_path() -> str:
    from open_instruct.data.embedded_default import ensure_embedded_model

    return str(ensure_embedded_model())
