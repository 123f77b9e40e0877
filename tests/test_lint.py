"""Lint is part of the suite: ``make lint`` (yamllint, ruff check and format, mypy strict,
antsibull-changelog, ansible-lint's production profile) must pass. Run from pytest, so that ``make test``
lints on one core while the lab tests run on the other."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_make_lint_passes() -> None:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    run = subprocess.run(
        ["make", "--no-print-directory", "lint"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1200, check=False,
    )  # fmt: skip
    assert run.returncode == 0, (run.stdout + run.stderr)[-12000:]
