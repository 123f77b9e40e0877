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
