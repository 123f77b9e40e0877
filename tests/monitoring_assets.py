"""The monitoring role's Grafana dashboards and Prometheus alert rules, read the way the tests need them.

The dashboards are Grafana's JSON model as the role copies them (files/dashboards/*.json); the alert rules are
a Jinja2 template that Ansible renders with the role's variables (templates/gpufleet-alerts.rules.yml.j2).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jinja2

REPO = Path(__file__).resolve().parents[1]
ROLE = REPO / "roles" / "monitoring"
DASHBOARD_DIR = ROLE / "files" / "dashboards"
RULES_TEMPLATE = ROLE / "templates" / "gpufleet-alerts.rules.yml.j2"

Dashboard = dict[str, Any]

# The role's defaults that the rules template reads (defaults/main.yml; a unit test keeps the two equal).
RULES_DEFAULTS: dict[str, object] = {
    "monitoring_alert_ttft_p99_seconds": 2.0,
    "monitoring_alert_itl_p99_seconds": 0.2,
    "monitoring_alert_kv_cache_usage": 0.95,
    "monitoring_alert_waiting_requests": 10,
    "monitoring_alert_for": "5m",
}
# What Ansible puts in ansible_managed unless ansible.cfg says otherwise.
ANSIBLE_MANAGED = "Ansible managed"

# PromQL words that look like names but are operators, modifiers or number literals.
_KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right"}
    | {"atan2", "inf", "nan"}
)
# String literals ("", '', ``) and # comments, in one pass so that a quote in a comment or a # in a string
# cannot start the other.
_STRINGS_AND_COMMENTS = re.compile(r'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'|`[^`]*`|#[^\n]*')
_LABEL_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\[\]]*\]")  # [5m], [$__rate_interval], subqueries [1h:5m]
_LABEL_LISTS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
# A name that does not continue a number (5m, 1e3), a Grafana variable ($__interval) or a field (.x).
_NAMES = re.compile(r"(?<![\w:.$])[A-Za-z_:][\w:]*")


# The alerts templates/gpufleet-alerts.rules.yml.j2 defines (the README and the role's docs name them).
ALERT_NAMES = frozenset(
    {
        "VllmTtftP99High",
        "VllmInterTokenLatencyP99High",
        "VllmKvCacheAlmostFull",
        "VllmWaitingQueueGrowing",
        "VllmPreempting",
        "TargetDown",
    }
)


def dashboards() -> dict[str, Dashboard]:
    """Every dashboard the role ships: file name -> parsed JSON."""
    return {
        path.name: json.loads(path.read_text(encoding="utf-8"))
        for path in sorted(DASHBOARD_DIR.glob("*.json"))
    }


def panels(dashboard: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """The dashboard's panels less its rows, including those a collapsed row keeps in its own `panels`."""
    for panel in dashboard.get("panels", []):
        if panel.get("type") == "row":
            yield from panels(panel)
        else:
            yield panel


def panel_queries(dashboard: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL expr) for every target of every panel; a target without expr gives ""."""
    return [
        (str(panel.get("title", "")), str(target.get("expr", "")))
        for panel in panels(dashboard)
        for target in panel.get("targets", [])
    ]


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects.

    Function and aggregation names (followed by a parenthesis), label names (in matchers and in
    by/without/on/ignoring/group_left/group_right lists), keywords, durations, numbers, string literals and
    Grafana variables are not metric names. A selector by `{__name__="..."}` alone is not seen.
    """
    text = _STRINGS_AND_COMMENTS.sub(" ", expr)
    text = _LABEL_MATCHERS.sub(" ", text)
    text = _RANGES.sub(" ", text)
    text = _LABEL_LISTS.sub(" ", text)
    names: set[str] = set()
    for match in _NAMES.finditer(text):
        name = match.group()
        is_call = text[match.end() :].lstrip().startswith("(")
        if not is_call and name.lower() not in _KEYWORDS:
            names.add(name)
    return names


def render_rules(variables: Mapping[str, object] | None = None) -> str:
    """The alert rules as Ansible's template module writes them, from the role's defaults and `variables`.

    Like Ansible: trim_blocks on, the file's trailing newline kept, and an undefined variable is an error.
    """
    environment = jinja2.Environment(
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,  # YAML, not HTML
    )
    template = environment.from_string(RULES_TEMPLATE.read_text(encoding="utf-8"))
    return template.render({"ansible_managed": ANSIBLE_MANAGED, **RULES_DEFAULTS, **(variables or {})})
