"""Issue 37, class 1: role variables' values are checked as the roles check them when they start
(ansible-core's own argument-spec validator), and against the ranges argument specs cannot say, before
anything runs."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from gpufleet.fleet import validate_inventory
from gpufleet.fleet.role_values import FLEET_ONLY_SPECS, RANGES, range_for, role_options
from gpufleet.fleet.schema import FLEET_ONLY_VARIABLES, VARIABLES

from .conftest import REPO, InventoryFactory

# (variable, a wrong value, what the problem line must say)
WRONG: list[tuple[str, Any, str]] = [
    # a value outside the role's choices
    ("vllm_service_executor", "rya", "one of auto, ray, mp"),
    ("ray_cluster_start_ray", "maybe", "one of auto, True, False"),
    ("docker_storage_driver", "overlay", "one of overlay2"),
    ("model_fetch_strategy", "chian", "one of auto, chain, fanout, direct"),
    ("image_distribution_strategy", "fan-out", "one of auto, chain, fanout, direct"),
    ("image_distribution_source", "registry", "one of auto, archive, pull"),
    ("nvidia_driver_method", "deb", "one of runfile, package"),
    ("cuda_toolkit_method", "apt", "one of package, runfile, redist"),
    ("model_fetch_verify", "md5", "one of sha256, size"),
    ("gateway_policy", "round-robin", "one of round_robin, power_of_two, cache_aware, random"),
    ("docker_service_restart", "sometimes", "one of no, always"),
    # a word where an integer, a number or a boolean belongs
    ("docker_wait_timeout", "sixty", "not convertible to int"),
    ("monitoring_prometheus_port", "9090x", "not convertible to int"),
    ("image_distribution_chain_min_bytes", "32M", "not convertible to int"),
    ("monitoring_alert_ttft_p99_seconds", "2s", "not convertible to float"),
    ("monitoring_alert_waiting_requests", 2.5, "not convertible to int"),
    ("monitoring_grafana", "sometimes", "not convertible to bool"),
    ("gpufleet_monitoring", "perhaps", "not convertible to bool"),
    ("gpufleet_fast_rerun", "quick", "not convertible to bool"),
    ("vllm_service_start_restarts", True, "a boolean"),
    ("ray_cluster_port", False, "a boolean"),
    # out of range
    ("image_distribution_relay_port", 70000, "from 1 to 65535"),
    ("model_fetch_relay_port", 0, "from 1 to 65535"),
    ("ray_cluster_port", 65536, "from 1 to 65535"),
    ("gateway_edge_port", -1, "from 1 to 65535"),
    ("monitoring_grafana_port", "99999", "from 1 to 65535"),
    ("monitoring_alert_kv_cache_usage", 95, "from 0 to 1 (a fraction: 0.95 for 95 %)"),
    ("vllm_service_start_timeout", 0, "at least 1 (seconds)"),
    ("docker_log_max_file", 0, "at least 1"),
    ("ray_cluster_num_gpus", -1, "at least 0"),
    ("preflight_min_free_gib", -5, "at least 0"),
    ("vllm_service_log_lines", 0, "at least 1"),
    ("model_fetch_lfs_concurrency", 0, "at least 1"),
    ("gateway_health_failure_threshold", 0, "at least 1"),
    # a name on the node (a directory, a unit instance) that could leave its directory or is not a unit name
    ("vllm_service_instance_id", "../etc", "1-32 lowercase letters, digits and '-'"),
    ("vllm_service_instance_id", "Big", "1-32 lowercase letters, digits and '-'"),
    ("vllm_service_instance_id", "a" * 33, "1-32 lowercase letters, digits and '-'"),
    ("vllm_service_instance_id", "", "1-32 lowercase letters, digits and '-'"),
]

# Values the roles take: never refused.
RIGHT: list[tuple[str, Any]] = [
    ("vllm_service_executor", "mp"),
    ("ray_cluster_start_ray", True),
    ("ray_cluster_start_ray", "auto"),
    ("monitoring_grafana", "yes"),
    ("gpufleet_monitoring", "true"),
    ("monitoring_prometheus_port", "9091"),
    ("monitoring_alert_kv_cache_usage", 0.9),
    ("docker_service_restart_sec", 0),
    ("ray_cluster_num_gpus", 0),
    ("image_distribution_chain_min_bytes", 0),
    ("vllm_service_instance_id", "qwen-7b-2"),
]


def problems(make_inventory: InventoryFactory, name: str, value: Any) -> list[str]:
    return [str(problem) for problem in validate_inventory(make_inventory(group_vars={name: value})).problems]


@pytest.mark.parametrize(("name", "value", "said"), WRONG, ids=[f"{n}={v!r}" for n, v, _ in WRONG])
def test_a_value_the_role_would_refuse_is_refused_by_validate(
    make_inventory: InventoryFactory, name: str, value: Any, said: str
) -> None:
    found = [line for line in problems(make_inventory, name, value) if f": {name}: found " in line]

    assert len(found) == 1, problems(make_inventory, name, value)
    line = found[0]
    assert said in line and repr(value) in line, line
    assert line.startswith("hosts head, worker: ") and ". Fix: set " in line, line


@pytest.mark.parametrize(("name", "value"), RIGHT, ids=[f"{n}={v!r}" for n, v in RIGHT])
def test_a_value_the_role_takes_is_not_refused(
    make_inventory: InventoryFactory, name: str, value: Any
) -> None:
    assert problems(make_inventory, name, value) == []


def test_every_numeric_role_variable_has_a_range() -> None:
    """A new int or float option without a rule here would take any number: this fails instead."""
    numeric = [
        option.name
        for option in role_options(REPO).values()
        if option.kind in ("int", "float") and option.name not in VARIABLES
    ]
    assert numeric and [name for name in numeric if range_for(name) is None] == []
    assert all(re.compile(pattern) for pattern, _ in RANGES)


def test_gpufleets_own_variables_are_typed() -> None:
    assert set(FLEET_ONLY_SPECS) == set(FLEET_ONLY_VARIABLES)


def test_forward_compat_false_as_a_word_is_false(make_inventory: InventoryFactory, tmp_path: Path) -> None:
    """gpufleet_cuda_forward_compat: "false" was read with Python's bool() (true): an image that needs a newer
    driver was accepted with a warning instead of refused."""
    old_pair = {"ray_cluster_image": "vllm/vllm-openai:v0.10.1.1", "nvidia_driver_version": "550.163.01"}
    said = {
        word: [str(p) for p in validate_inventory(
            make_inventory(group_vars={**old_pair, "gpufleet_cuda_forward_compat": word})
        ).problems]
        for word in ("false", "no", "true")
    }  # fmt: skip

    assert any("CUDA 12.8" in line for line in said["false"]), said
    assert said["no"] == said["false"]
    assert not any("CUDA 12.8" in line for line in said["true"]), said


def test_thousands_of_variables_validate_in_seconds(make_inventory: InventoryFactory) -> None:
    """The "did you mean" search once took ~15 s per host for 3,000 misspelt settings (difflib against every
    known name, again on every host); it compares within the namespace, once per name. A bound, not a
    benchmark: it catches the return of the quadratic search, not a few percent. CPU seconds of this
    process, not wall time: a busy machine (the suite's other worker, its labs) stretched that to 16.4 s."""
    variables = {f"vllm_service_setting_{i}": i for i in range(3000)}
    variables |= {f"site_var_{i}": i for i in range(3000)}
    path = make_inventory(group_vars=variables)

    started = time.process_time()
    found = validate_inventory(path).problems
    seconds = time.process_time() - started

    assert len([p for p in found if p.variable.startswith("vllm_service_setting_")]) == 3000
    assert seconds < 15, f"{seconds:.1f} s"
