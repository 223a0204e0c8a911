"""Shared fixtures for the core's unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from agent_stores.plugins import reset_registry


@pytest.fixture
def fresh_registry() -> Iterator[None]:
    """Reload plugins for the test and forget them afterwards."""
    reset_registry()
    yield
    reset_registry()
