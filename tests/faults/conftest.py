"""The fault stack is brought back whole before the first scenario: a scenario that failed
mid-fault in an earlier session may have left its broker or database stopped, and the
`stack` fixture would then refuse to start.

And what the scenarios (tests/faults/test_scenarios_*.py) ask for: a whole stack before each
one (`healthy_stack`, by their pytestmark), and a worker group of their own (`group`)."""

from __future__ import annotations

import pytest

from evalstream.common.settings import Settings
from tests.faults.scenario_tools import Group
from tests.support import stack_cmd


@pytest.fixture(scope="session", autouse=True)
def whole_fault_stack() -> None:
    stack_cmd("up")


@pytest.fixture
def healthy_stack(stack: Settings) -> None:
    """Every scenario starts from a whole stack, whatever the one before it broke."""
    stack_cmd("up")


@pytest.fixture
def group(spawn) -> Group:
    return Group(spawn, delay_ms=10)
