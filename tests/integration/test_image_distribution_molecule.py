"""molecule/image_distribution: prepare (an image bundle; Debian's docker.io on the offline hosts) -> check
-> converge -> idempotence -> testinfra verify -> destroy on three lab hosts."""

from __future__ import annotations

import pytest
from test_model_fetch_molecule import run_scenario

pytestmark = [pytest.mark.lab, pytest.mark.slow, pytest.mark.timeout(1200)]


def test_image_distribution_scenario_passes() -> None:
    run_scenario("image_distribution")
