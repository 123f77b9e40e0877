"""The monitoring role's Grafana dashboards and Prometheus alert rules, checked without Grafana or Prometheus.

The dashboards are validated against Grafana's own dashboard schema: data/grafana_dashboard.schema.json is
generated from the npm package @grafana/schema of the Grafana version the role runs (its `$comment` says how).
Every query may only name metrics this file lists, so a typo in a metric name fails here rather than showing
an empty panel. On the node, promtool checks the rendered rules before Prometheus loads them
(tasks/prometheus.yml).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import jsonschema
import pytest
import yaml
from jsonschema.exceptions import best_match
from yamllint import linter
from yamllint.config import YamlLintConfig

from ..monitoring_assets import (
    ALERT_NAMES,
    RULES_DEFAULTS,
    dashboards,
    metric_names,
    panel_queries,
    panels,
    render_rules,
)
from .conftest import REPO

SCHEMA = REPO / "tests" / "unit" / "data" / "grafana_dashboard.schema.json"

# vLLM's names, old and new: vLLM renamed gpu_cache_usage_perc -> kv_cache_usage_perc,
# time_per_output_token_seconds -> inter_token_latency_seconds, and replaced gpu_prefix_cache_hit_rate by
# the prefix_cache_hits/queries counters.
VLLM_METRICS = {
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:inter_token_latency_seconds_bucket",
    "vllm:time_per_output_token_seconds_bucket",
    "vllm:e2e_request_latency_seconds_bucket",
    "vllm:num_preemptions_total",
    "vllm:prefix_cache_hits_total",
    "vllm:prefix_cache_queries_total",
    "vllm:gpu_prefix_cache_hit_rate",
}
DCGM_METRICS = {
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_XID_ERRORS",
}
NODE_METRICS = {
    "node_cpu_seconds_total",
    "node_memory_MemAvailable_bytes",
    "node_memory_MemTotal_bytes",
    "node_filesystem_avail_bytes",
    "node_network_receive_bytes_total",
    "node_network_transmit_bytes_total",
}
# vllm-router 0.1.17's own (its Prometheus port; read off a lab router), and the vLLM counter the services
# dashboard splits by replica
ROUTER_METRICS = {
    "vllm_router_worker_health",
    "vllm_router_requests_total",
    "vllm_router_request_errors_total",
    "vllm_router_generate_duration_seconds_bucket",
    "vllm_router_processed_requests_total",
}
# what the services dashboard charts of vLLM, per replica
SERVICES_VLLM_METRICS = {
    "vllm:request_success_total",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "vllm:time_to_first_token_seconds_bucket",
}
ALLOWED_METRICS = VLLM_METRICS | SERVICES_VLLM_METRICS | DCGM_METRICS | NODE_METRICS | ROUTER_METRICS | {"up"}
# Names that mean the same thing in two vLLM generations: one query must ask for both.
SAME_METRIC_PAIRS = [
    ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    ("vllm:inter_token_latency_seconds_bucket", "vllm:time_per_output_token_seconds_bucket"),
    ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hit_rate"),
]
DASHBOARDS = {
    "gpufleet-vllm.json": ("gpufleet-vllm", VLLM_METRICS),
    "gpufleet-gpu.json": ("gpufleet-gpu", DCGM_METRICS | NODE_METRICS | {"up"}),
    "gpufleet-services.json": ("gpufleet-services", ROUTER_METRICS | SERVICES_VLLM_METRICS | {"up"}),
}
ALERTS = ALERT_NAMES


@pytest.fixture(scope="module")
def schema_validator() -> jsonschema.Draft7Validator:
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def schema_errors(validator: jsonschema.Draft7Validator, dashboard: dict[str, Any]) -> list[str]:
    """One line per error; for a panel that fits neither Panel nor RowPanel, the likelier reason."""
    errors = [
        best_match(error.context) if error.context else error for error in validator.iter_errors(dashboard)
    ]
    return [f"{error.json_path}: {error.message[:300]}" for error in errors]


def datasources(node: Any) -> Iterator[Any]:
    """Every value under a `datasource` key, anywhere in the dashboard."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "datasource":
                yield value
            yield from datasources(value)
    elif isinstance(node, list):
        for item in node:
            yield from datasources(item)


def rules() -> dict[str, dict[str, Any]]:
    document = yaml.safe_load(render_rules({}))
    return {rule["alert"]: rule for group in document["groups"] for rule in group["rules"]}


# Dashboards --------------------------------------------------------------------------------------------


def test_the_role_ships_its_three_dashboards() -> None:
    assert sorted(dashboards()) == sorted(DASHBOARDS)


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_dashboard_matches_grafana_schema(name: str, schema_validator: jsonschema.Draft7Validator) -> None:
    assert schema_errors(schema_validator, dashboards()[name]) == []


def _drop_grid_width(board: dict[str, Any]) -> None:
    del board["panels"][1]["gridPos"]["w"]


def _misspell_grid_pos(board: dict[str, Any]) -> None:
    board["panels"][1]["gridpos"] = board["panels"][1].pop("gridPos")


def _schema_version_as_text(board: dict[str, Any]) -> None:
    board["schemaVersion"] = "39"


def _unknown_variable_type(board: dict[str, Any]) -> None:
    board["templating"]["list"][0]["type"] = "datasorce"


@pytest.mark.parametrize(
    "breakage", [_drop_grid_width, _misspell_grid_pos, _schema_version_as_text, _unknown_variable_type]
)
def test_grafana_schema_rejects_a_broken_dashboard(
    breakage: Callable[[dict[str, Any]], None], schema_validator: jsonschema.Draft7Validator
) -> None:
    board = copy.deepcopy(dashboards()["gpufleet-vllm.json"])
    breakage(board)
    assert schema_errors(schema_validator, board) != []


@pytest.mark.parametrize(("name", "uid"), [(name, uid) for name, (uid, _) in sorted(DASHBOARDS.items())])
def test_dashboard_identity(name: str, uid: str) -> None:
    board = dashboards()[name]
    assert (board["uid"], board["schemaVersion"], board["tags"]) == (uid, 39, ["gpufleet"])
    assert board["title"] and board["refresh"] and board["time"]["from"].startswith("now-")


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_every_panel_has_a_query(name: str) -> None:
    empty = [
        panel.get("title")
        for panel in panels(dashboards()[name])
        if not any(target.get("expr", "").strip() for target in panel.get("targets", []))
    ]
    assert empty == [], f"{name}: panels without a PromQL query: {empty}"


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_every_target_has_a_ref_id_and_a_datasource(name: str) -> None:
    targets = [target for panel in panels(dashboards()[name]) for target in panel.get("targets", [])]
    assert all(target.get("refId") and target.get("datasource") for target in targets)


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_queries_name_only_known_metrics(name: str) -> None:
    unknown = {
        (title, metric)
        for title, expr in panel_queries(dashboards()[name])
        for metric in metric_names(expr) - ALLOWED_METRICS
    }
    assert unknown == set(), (
        f"{name}: unknown metric names (a typo, or add them to this test): {sorted(unknown)}"
    )


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_variable_queries_name_only_known_metrics(name: str) -> None:
    queries = [
        variable["query"]
        for variable in dashboards()[name]["templating"]["list"]
        if variable["type"] == "query"
    ]
    # Grafana's label_values(selector, label): only the selector is PromQL.
    calls = [re.fullmatch(r"label_values\((.+),\s*\w+\)", query["query"]) for query in queries]
    assert all(calls), f"{name}: variable queries other than label_values(selector, label): {queries}"
    assert set().union(*(metric_names(call.group(1)) for call in calls if call)) <= ALLOWED_METRICS


@pytest.mark.parametrize(
    ("name", "metrics"), [(name, metrics) for name, (_, metrics) in sorted(DASHBOARDS.items())]
)
def test_dashboard_charts_every_metric_it_is_for(name: str, metrics: set[str]) -> None:
    charted = set().union(*(metric_names(expr) for _, expr in panel_queries(dashboards()[name])))
    assert metrics - charted == set()


@pytest.mark.parametrize(("new", "old"), SAME_METRIC_PAIRS)
def test_dashboard_asks_old_and_new_vllm_names_in_one_query(new: str, old: str) -> None:
    exprs = [expr for _, expr in panel_queries(dashboards()["gpufleet-vllm.json"])]
    assert any({new, old} <= metric_names(expr) for expr in exprs)


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_no_dashboard_hard_codes_a_datasource(name: str) -> None:
    board = dashboards()[name]
    refs = list(datasources(board["panels"])) + list(datasources(board["templating"]))
    assert refs, f"{name} names no datasource at all"
    fixed = [ref for ref in refs if not isinstance(ref, dict) or not str(ref.get("uid", "")).startswith("$")]
    assert fixed == [], f"{name}: datasource references that are not the ${{datasource}} variable: {fixed}"


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_datasource_variable_picks_a_prometheus(name: str) -> None:
    variables = {variable["name"]: variable for variable in dashboards()[name]["templating"]["list"]}
    assert (variables["datasource"]["type"], variables["datasource"]["query"]) == ("datasource", "prometheus")


def test_panel_queries_reads_panels_inside_a_collapsed_row() -> None:
    board = {
        "panels": [
            {"type": "stat", "title": "top", "targets": [{"refId": "A", "expr": "up"}]},
            {
                "type": "row",
                "title": "row",
                "collapsed": True,
                "panels": [
                    {"type": "timeseries", "title": "inside", "targets": [{"refId": "A"}, {"expr": "x"}]}
                ],
            },
        ]
    }
    assert panel_queries(board) == [("top", "up"), ("inside", ""), ("inside", "x")]


# metric_names ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("up", {"up"}),
        ("up == 0", {"up"}),
        ('rate(node_cpu_seconds_total{mode="idle", cpu=~"0|1"}[5m])', {"node_cpu_seconds_total"}),
        (
            "histogram_quantile(0.99, sum by (le, model_name)"
            " (rate(vllm:e2e_request_latency_seconds_bucket[$__rate_interval])))",
            {"vllm:e2e_request_latency_seconds_bucket"},
        ),
        ("sum(rate(a_total[1m])) without (instance) / ignoring (job) group_left (node) b", {"a_total", "b"}),
        ("a on (node) group_right c", {"a", "c"}),
        ("a offset 5m and bool_metric unless b offset 1h30m", {"a", "bool_metric", "b"}),
        ("a > bool 1e3 or b < Inf or c != NaN", {"a", "b", "c"}),
        ('label_replace(a, "dst", "$1", "src", "(.*)")', {"a"}),
        ("a{path=\"{weird}\", q='it\\'s'} # a comment naming fake_metric", {"a"}),
        ('-sum by (node) (rate(b{device!="lo", node=~"$node"}[$__rate_interval]))', {"b"}),
        ("max_over_time(a[1h:5m]) @ end()", {"a"}),
        ("count by (job) (up == 0) or sum by (job) (up * 0)", {"up"}),
    ],
)
def test_metric_names(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


# Alert rules -------------------------------------------------------------------------------------------


def test_rules_defaults_are_the_roles_defaults() -> None:
    defaults = yaml.safe_load(
        (REPO / "roles" / "monitoring" / "defaults" / "main.yml").read_text(encoding="utf-8")
    )
    assert {key: defaults[key] for key in RULES_DEFAULTS} == RULES_DEFAULTS


def test_rules_hold_the_six_alerts_in_group_gpufleet() -> None:
    document = yaml.safe_load(render_rules({}))
    assert [group["name"] for group in document["groups"]] == ["gpufleet"]
    assert set(rules()) == ALERTS


@pytest.mark.parametrize("alert", sorted(ALERTS))
def test_alert_says_how_bad_where_and_what_to_look_at(alert: str) -> None:
    rule = rules()[alert]
    assert rule["labels"]["severity"] in {"critical", "warning", "info"}
    assert "{{ $labels.node }}" in rule["annotations"]["summary"]
    assert "{{ $labels.instance }}" in rule["annotations"]["description"]
    assert "Look at" in rule["annotations"]["description"]


def test_rules_keep_prometheus_templates_for_prometheus() -> None:
    text = render_rules({})
    assert "{{ $labels.node }}" in text and "{{ $value | humanizeDuration }}" in text
    assert "{%" not in text and "{#" not in text


def test_rules_start_with_ansible_managed() -> None:
    assert render_rules({"ansible_managed": "Managed by gpufleet"}).splitlines()[0] == "# Managed by gpufleet"


def test_rules_thresholds_come_from_the_role_variables() -> None:
    text = render_rules(
        {
            "monitoring_alert_ttft_p99_seconds": 3.5,
            "monitoring_alert_itl_p99_seconds": 0.125,
            "monitoring_alert_kv_cache_usage": 0.875,
            "monitoring_alert_waiting_requests": 42,
            "monitoring_alert_for": "7m",
        }
    )
    alerts = {rule["alert"]: rule for group in yaml.safe_load(text)["groups"] for rule in group["rules"]}
    assert alerts["VllmTtftP99High"]["expr"].endswith("> 3.5")
    assert alerts["VllmInterTokenLatencyP99High"]["expr"].endswith("> 0.125")
    assert alerts["VllmKvCacheAlmostFull"]["expr"].endswith("> 0.875")
    # the queue length first: an alert's $value is its left operand's sample (found by review: the slope)
    assert alerts["VllmWaitingQueueGrowing"]["expr"].startswith("vllm:num_requests_waiting > 42 and deriv(")
    assert (alerts["VllmWaitingQueueGrowing"]["for"], alerts["TargetDown"]["for"]) == ("7m", "7m")


def test_rules_default_thresholds() -> None:
    alerts = rules()
    assert alerts["VllmKvCacheAlmostFull"]["expr"].endswith("> 0.95")
    assert alerts["VllmKvCacheAlmostFull"]["for"] == "5m"
    assert alerts["VllmTtftP99High"]["for"] == "5m"
    assert "deriv(vllm:num_requests_waiting[5m]) > 0" in alerts["VllmWaitingQueueGrowing"]["expr"]
    assert alerts["TargetDown"]["expr"] == "up == 0"


def test_rules_name_only_known_metrics() -> None:
    unknown = {
        (alert, name)
        for alert, rule in rules().items()
        for name in metric_names(rule["expr"]) - ALLOWED_METRICS
    }
    assert unknown == set()


@pytest.mark.parametrize(
    ("alert", "names"),
    [
        ("VllmKvCacheAlmostFull", {"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"}),
        (
            "VllmInterTokenLatencyP99High",
            {"vllm:inter_token_latency_seconds_bucket", "vllm:time_per_output_token_seconds_bucket"},
        ),
    ],
)
def test_rules_ask_old_and_new_vllm_names(alert: str, names: set[str]) -> None:
    assert metric_names(rules()[alert]["expr"]) == names


def test_rendered_rules_pass_yamllint() -> None:
    config = YamlLintConfig(file=str(REPO / ".yamllint"))
    problems = [f"{problem.line}: {problem.message}" for problem in linter.run(render_rules({}), config)]
    assert problems == []
