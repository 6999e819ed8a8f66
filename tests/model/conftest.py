"""The hf engine, loaded once for every model test (both engines' modules use it)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from evalstream.common.settings import Settings
from evalstream.common.specs import DEFAULT_MODEL_HF
from evalstream.worker.engines import load_engine
from evalstream.worker.engines.hf import HFEngine


@pytest.fixture(scope="session")
def hf() -> Iterator[HFEngine]:
    loaded = load_engine(DEFAULT_MODEL_HF, Settings.from_env())
    assert isinstance(loaded, HFEngine)
    yield loaded
    loaded.close()
