"""Problems a user can cause, each said as one line: where, which variable, found, expected, the fix."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    where: str
    variable: str
    found: str
    expected: str
    fix: str

    def __str__(self) -> str:
        return f"{self.where}: {self.variable}: found {self.found}; expected {self.expected}. Fix: {self.fix}"


class InventoryError(Exception):
    """An inventory gpufleet cannot use; ``str()`` gives one line per problem."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(str(problem) for problem in self.problems))


def merged(problems: Sequence[Problem]) -> list[Problem]:
    """One line for a problem that several hosts share (a bad group variable shows on every host)."""
    groups: dict[tuple[str, str, str, str], list[str]] = {}
    for problem in problems:
        groups.setdefault((problem.variable, problem.found, problem.expected, problem.fix), []).append(
            problem.where
        )
    result = []
    for (variable, found, expected, fix), wheres in groups.items():
        unique = list(dict.fromkeys(wheres))
        where = unique[0]
        if len(unique) > 1 and all(w.startswith("host ") for w in unique):
            where = "hosts " + ", ".join(w.removeprefix("host ") for w in unique)
        elif len(unique) > 1:
            where = "; ".join(unique)
        result.append(Problem(where, variable, found, expected, fix))
    return result


def without_echoes(problems: Sequence[Problem]) -> list[Problem]:
    """Drop "not set" problems for a variable that already has a problem (e.g. a template that failed)."""
    seen: set[str] = set()
    kept = []
    for problem in problems:
        if problem.found.startswith("nothing (") and problem.variable in seen:
            continue
        seen.add(problem.variable)
        kept.append(problem)
    return kept
