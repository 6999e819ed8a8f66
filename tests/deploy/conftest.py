"""The Helm chart rendered once for the deploy tests (tests/deploy/test_helm_chart_*.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy import chart
from tests.deploy.chart import VALUE_SETS


@pytest.fixture(scope="session")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """Each good value set's objects, rendered once: a test that changes them changes a copy."""
    tmp = tmp_path_factory.mktemp("helm")
    return {name: chart.render([chart.VALUES / f"{name}.yaml"], tmp) for name in VALUE_SETS}
