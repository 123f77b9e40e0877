"""What every command prints with ``--json``: one JSON object on stdout, refusals included.

A success is the command's own object; a refusal is ``{"ok": false, "exit_code": N, "problems": [...]}``
with one line per problem, the same lines the command prints on stderr without ``--json``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any


def emit(payload: dict[str, Any]) -> None:
    print(json.dumps(payload, indent=2, default=str))


def refuse(lines: Sequence[str], *, code: int, as_json: bool, prefix: str = "") -> int:
    """Report a refusal: JSON on stdout, or each line on stderr; returns ``code``."""
    if as_json:
        emit({"ok": False, "exit_code": code, "problems": [str(line) for line in lines]})
    else:
        for line in lines:
            print(f"{prefix}{line}", file=sys.stderr)
    return code
