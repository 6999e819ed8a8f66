"""What the store-privilege tests (tests/integration/test_store_privileges_*.py) ask for, by
their pytestmark: the local stack, whose stores have a role and a key pair per principal."""

from __future__ import annotations

import pytest

from evalstream.common.settings import Settings


@pytest.fixture
def local_stack(stack: Settings) -> None:
    """These tests are about the local stack's roles and identities (testcontainers' stores
    have one set of credentials for everything)."""
    assert stack.kafka_security_protocol != "PLAINTEXT", (
        'run against the local stack with eval "$(ops/local/stack.py env)": its stores have a role and '
        "a key pair per principal"
    )
