"""Fixtures of the data tests: a decoded-image cache shared by the whole session."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def shared_cache(tmp_path_factory) -> Path:
    """One cache folder for every test that decodes ../shared/data, so each set is decoded once per session."""
    return tmp_path_factory.mktemp("shared-data-cache")
