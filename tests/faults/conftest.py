"""The fault stack is brought back whole before the first scenario: a scenario that failed
mid-fault in an earlier session may have left its broker or database stopped, and the
`stack` fixture would then refuse to start."""

from __future__ import annotations

import pytest

from tests.faults.harness import stack_cmd


@pytest.fixture(scope="session", autouse=True)
def whole_fault_stack() -> None:
    stack_cmd("up")
