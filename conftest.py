"""The suite's summary hook, here at the top so that pytest-xdist's controller loads it too: the controller
collects nothing, so tests/integration/conftest.py (the lab fixtures, the suite's order) is loaded only by the
workers. Kept out of the collection (galaxy.yml build_ignore)."""

from __future__ import annotations

import pytest


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The laps of every long lab test that kept them (services_support.Laps), after the durations: each
    run of `make test` says where its slowest test's minutes went (issue 33)."""
    reports = [
        report
        for outcome in ("passed", "failed")
        for report in terminalreporter.stats.get(outcome, [])
        if getattr(report, "when", "") == "call" and any(key == "lap" for key, _ in report.user_properties)
    ]
    if reports:
        terminalreporter.write_sep("=", "laps of the long lab tests")
    for report in reports:
        terminalreporter.write_line(report.nodeid)
        for key, text in report.user_properties:
            if key == "lap":
                terminalreporter.write_line(f"  {text}")
