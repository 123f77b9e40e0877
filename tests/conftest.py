"""The suite's order: the longest files first, the rest as collected.

``make test`` runs pytest on both cores (pytest-xdist, ``--dist loadfile --no-loadscope-reorder``): every
file goes whole to one worker, in this order, and a worker takes the next file when it is nearly done with
its own. Starting with the longest file (the end-to-end lab, about 17 minutes alone) lets the other worker
work through every other file meanwhile; a long file taken last would leave one worker idle at the end. A
serial run (``make unit``, ``pytest FILE``) keeps the same order, which changes nothing there.
"""

from __future__ import annotations

import pytest

# Longest first, from `--durations` of serial runs on the 2-core machine (2026-12-01).
SLOWEST_FIRST = (
    "tests/integration/test_e2e.py",  # one deployed lab for every test in it (~1,000 s)
    "tests/test_lint.py",  # the linters (~60 s): early, so that a lint failure shows early
    "tests/integration/test_molecule.py",  # every role's scenario (~450 s)
    "tests/integration/test_image_distribution.py",
    "tests/integration/test_relay_trust.py",
    "tests/integration/test_model_fetch.py",
    "tests/integration/test_lab_docker.py",
    "tests/integration/test_cancel.py",
    "tests/integration/test_collection.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: index for index, path in enumerate(SLOWEST_FIRST)}
    # a stable sort: the files not named, and every file's own tests, keep their order
    items.sort(key=lambda item: rank.get(item.nodeid.partition("::")[0], len(rank)))
