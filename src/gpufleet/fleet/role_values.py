"""Role variables' values, checked as the roles check them when they start, and the ranges specs cannot say.

Each role's ``meta/argument_specs.yml`` is what ansible-core's ``validate_argument_spec`` checks at the role's
start, on the host, after earlier stages have already changed the fleet. Validation runs the same validator
(``ansible.module_utils.common.arg_spec.ArgumentSpecValidator``) on the values the inventory (and ``-e``)
gives each host, before anything runs: a value outside a role's ``choices``, a word where an integer or a
boolean belongs, a mapping where a list belongs. Argument specs have no ranges, so :data:`RANGES` gives
every numeric role variable one (ports 1-65535, seconds and counts, fractions 0-1); a unit test fails on a
numeric variable no rule covers. Variables typed by the fleet schema (``schema.VARIABLES``) are checked there.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from gpufleet.fleet.raw import RawHost
from gpufleet.fleet.schema import CONTROL, VARIABLES
from gpufleet.problems import Problem


@dataclass(frozen=True)
class Range:
    """The values a numeric role variable may take, inclusive; ``None``: unbounded on that side."""

    low: float | None
    high: float | None
    what: str  # "a TCP port", "seconds", "a fraction": said in the expected value

    def holds(self, value: float) -> bool:
        return (self.low is None or value >= self.low) and (self.high is None or value <= self.high)

    def describe(self, kind: str) -> str:
        if self.high is None:
            return f"{kind} of at least {_number(self.low)} ({self.what})"
        return f"{kind} from {_number(self.low)} to {_number(self.high)} ({self.what})"


PORT = Range(1, 65535, "a TCP port")
FRACTION = Range(0, 1, "a fraction: 0.95 for 95 %")
# The first rule whose pattern matches the whole variable name gives its range.
RANGES: tuple[tuple[str, Range], ...] = (
    (r".*_port", PORT),
    (r".*_(timeout|reboot_timeout)", Range(1, None, "seconds")),
    (r".*_restart_sec", Range(0, None, "seconds")),
    (r"monitoring_alert_.*_seconds", Range(0, None, "seconds")),
    (r"monitoring_alert_kv_cache_usage", FRACTION),
    (r"monitoring_alert_waiting_requests", Range(0, None, "requests")),
    (r"vllm_service_start_restarts", Range(0, None, "restarts")),
    (r".*_log_lines", Range(1, None, "lines")),
    (r"docker_log_max_file", Range(1, None, "files")),
    (r".*_tensor_parallel_size|.*_pipeline_parallel_size", Range(1, None, "GPUs")),
    (r".*_chain_min_bytes|(.*_)?relay_size", Range(0, None, "bytes")),
    (r"ray_cluster_object_store_memory", Range(1, None, "bytes")),
    (r".*_concurrency", Range(1, None, "transfers at once")),
    (r"ray_cluster_num_(cpus|gpus)", Range(0, None, "per node")),
    (r".*_(gib|gb)", Range(0, None, "GiB")),
    (r"vllm_service_(max_model_len|max_num_batched_tokens)", Range(1, None, "tokens")),
    (r"vllm_service_max_num_seqs", Range(1, None, "sequences")),
    (r"gateway_health_check_interval", Range(1, None, "seconds")),
    (r"gateway_health_failure_threshold", Range(1, None, "failed checks")),
    (r"gateway_edge_max_body_kib", Range(1, 1048576, "KiB")),
)
# Strings that name things on the node (a directory, a systemd unit instance): the whole value must match.
PATTERNS: Mapping[str, tuple[str, str]] = {
    "vllm_service_instance_id": (
        r"[a-z0-9][a-z0-9-]{0,31}",
        "1-32 lowercase letters, digits and '-', starting with a letter or digit",
    ),
}
# Mappings written to an environment file, one NAME=VALUE line each, unquoted: names and text values only.
ENVIRONMENT = r".*_(env|environment)"
KINDS = {
    "int": "an integer",
    "float": "a number",
    "bool": "a boolean (true or false)",
    "list": "a list",
    "dict": "a mapping",
    "str": "a string",
    "path": "a path",
}


# gpufleet's own variables that no role's specs declare (schema.FLEET_ONLY_VARIABLES), typed as the runner
# and the roles read them; a unit test keeps the two lists equal.
FLEET_ONLY_SPECS: Mapping[str, Mapping[str, Any]] = {
    "gpufleet_api_key_file": {"type": "path"},
    "gpufleet_bundle_signers": {"type": "path"},
    "gpufleet_cuda_forward_compat": {"type": "bool"},
    "gpufleet_fast_rerun": {"type": "bool"},
    "gpufleet_grafana_password_file": {"type": "path"},
    "gpufleet_lab": {"type": "bool"},
    "gpufleet_monitoring": {"type": "bool"},
    "gpufleet_services": {"type": "raw"},  # fleet/services.py checks it, naming each service and field
}


# Ansible's own connection variables gpufleet's inventories set: a wrong one fails every host's first task.
CONNECTION = "ansible"
CONNECTION_SPECS: Mapping[str, Mapping[str, Any]] = {
    "ansible_port": {"type": "int"},
    "ansible_user": {"type": "str"},
}


@dataclass(frozen=True)
class Option:
    role: str | None  # None: gpufleet's own (FLEET_ONLY_SPECS)
    name: str
    spec: Mapping[str, Any]  # the option as ArgumentSpecValidator takes it (no description)

    @property
    def kind(self) -> str:
        return str(self.spec.get("type", "str"))

    @property
    def refuses(self) -> str:
        if self.role is None:
            return "gpufleet reads it so (the README's inventory reference)"
        if self.role == CONNECTION:
            return "Ansible connects to the host with it"
        return (
            f"the {self.role} role would refuse it on the host after earlier stages ran "
            f"(roles/{self.role}/meta/argument_specs.yml)"
        )


def range_for(name: str) -> Range | None:
    return next((limits for pattern, limits in RANGES if re.fullmatch(pattern, name)), None)


def role_defaults(root: Path | None, role: str) -> dict[str, Any]:
    """A role's ``defaults/main.yml`` as written (templated values unrendered); {} without the role. The one
    reader of role defaults: validation's checks take a value the inventory does not set from here."""
    path = root / "roles" / role / "defaults" / "main.yml" if root else None
    if path is None or not path.is_file():
        return {}
    return yaml.safe_load(path.read_text(encoding="utf-8")) or {}


@cache
def role_options(root: Path) -> Mapping[str, Option]:
    """Every option of every entry point of every role's argument specs, by name (the first entry point's),
    and gpufleet's own (:data:`FLEET_ONLY_SPECS`)."""
    found = {name: Option(None, name, spec) for name, spec in FLEET_ONLY_SPECS.items()}
    found |= {name: Option(CONNECTION, name, spec) for name, spec in CONNECTION_SPECS.items()}
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    for spec_file in sorted(root.glob("roles/*/meta/argument_specs.yml")):
        role = spec_file.parent.parent.name
        specs = yaml.load(spec_file.read_text(encoding="utf-8"), Loader=loader) or {}
        for entry in (specs.get("argument_specs") or {}).values():
            for name, option in ((entry or {}).get("options") or {}).items():
                if str(name) not in found and isinstance(option, Mapping):
                    spec = {key: val for key, val in option.items() if key not in ("description", "default")}
                    found[str(name)] = Option(role, str(name), spec)
    return found


def check_values(host: RawHost, options: Mapping[str, Option]) -> Iterator[Problem]:
    """What each role would refuse at its start, and values out of their range, for one host's variables."""
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator  # noqa: PLC0415  (ansible's import)

    for name in sorted(host.variables):
        option = options.get(name)
        if option is None or name in VARIABLES:
            continue
        value = host.variables[name]
        if value is None:
            continue  # unset: the role's default
        expected = _expected(option)
        if option.kind in ("int", "float") and isinstance(value, bool):
            yield _problem(host, option, value, expected, "a boolean")
            continue
        if (why := as_written(option, value)) is not None:
            said = (
                f"the {option.role} role reads the value as written"
                if option.role not in (None, CONNECTION)
                else ""
            )
            yield _problem(host, option, value, expected, why, said=said)
            continue
        result = ArgumentSpecValidator({name: dict(option.spec)}).validate({name: value})
        if result.error_messages:
            yield _problem(host, option, value, expected, _reason(result.error_messages[0]))
            continue
        checked = result.validated_parameters.get(name)
        if name in PATTERNS and not re.fullmatch(PATTERNS[name][0], str(checked)):
            yield _problem(host, option, value, PATTERNS[name][1], "names a directory and a unit on the node")
            continue
        limits = range_for(name)
        if limits is not None and isinstance(checked, int | float) and not limits.holds(checked):
            yield _problem(host, option, value, limits.describe(KINDS[option.kind]), "out of range")


def as_written(option: Option, value: Any) -> str | None:
    """Why ``value`` is not what the role reads, although Ansible's validator would convert it: the role reads
    the variable as written, not as the validator converted it (``"a=1"`` is no mapping, ``["x"]`` no text),
    and what YAML made of an unquoted value is seldom what was meant (``12.10`` is the number 12.1)."""
    text = option.kind in ("str", "path") and not option.spec.get("choices")  # choices say what they take
    reasons = (
        (isinstance(value, float) and not math.isfinite(value), "not a finite number"),
        (
            option.kind == "dict" and not isinstance(value, Mapping),
            "not written as a mapping (name: value lines)",
        ),
        (option.kind == "list" and not isinstance(value, list), "not written as a list ([a, b] or - lines)"),
        (text and isinstance(value, Mapping), "a mapping where text belongs"),
        (text and isinstance(value, list), "a list where text belongs"),
        (
            text and isinstance(value, bool),
            "YAML read a boolean (yes, no, on, off, true, false); quote the text",
        ),
        (
            text and isinstance(value, float),
            f"YAML read the number {value!r}; quote the text (unquoted, 12.10 is 12.1)",
        ),
        (
            text and isinstance(value, str) and CONTROL.search(value) is not None,
            "control characters (a newline, a tab, an escape)",
        ),
    )
    found = next((why for wrong, why in reasons if wrong), None)
    if found is None and option.kind == "dict" and re.fullmatch(ENVIRONMENT, option.name):
        line = Option(option.role, option.name, {"type": "str"})  # a line NAME=VALUE of an env file each
        found = next(
            (
                f"{name!r}: {why}"
                for name, item in value.items()
                if (why := _env_name(name) or as_written(line, item))
            ),
            None,
        )
    if found is None and option.kind == "list" and option.spec.get("elements") in ("str", "path"):
        each = Option(option.role, option.name, {"type": option.spec["elements"]})  # the text rules, per item
        found = next(
            (f"item {n}: {why}" for n, item in enumerate(value) if (why := as_written(each, item))), None
        )
    return found


def _env_name(name: Any) -> str | None:
    if isinstance(name, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        return None
    return "not an environment variable's name (letters, digits and '_', not starting with a digit)"


def _expected(option: Option) -> str:
    if choices := option.spec.get("choices"):
        return "one of " + ", ".join(str(choice) for choice in choices)
    limits = range_for(option.name)
    kind = KINDS.get(option.kind, f"a {option.kind}")
    if option.kind == "list" and option.spec.get("elements") in ("str", "path"):
        kind = "a list of strings"
    if option.kind == "dict" and re.fullmatch(ENVIRONMENT, option.name):
        kind = "a mapping of environment variable names to text"
    return limits.describe(kind) if limits is not None and option.kind in ("int", "float") else kind


def _reason(message: str) -> str:
    """Ansible's message, less what the problem line says anyway (the variable's name and its value)."""
    if "must be one of" in message:
        return "not one of the role's choices"
    match = re.search(r"unable to convert to (\w+)", message)
    return f"not convertible to {match.group(1)}" if match else message.split(":", maxsplit=1)[0]


def _problem(
    host: RawHost, option: Option, value: Any, expected: str, why: str, *, said: str = ""
) -> Problem:
    shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
    return Problem(
        f"host {host.name}",
        option.name,
        f"{shown} ({why})",
        expected,
        f"set {option.name} to {expected}; {said or option.refuses}",
    )


def _number(value: float | None) -> str:
    return f"{value:g}" if value is not None else "-"


def ansible_bool(value: Any, *, default: bool) -> bool:
    """Ansible's reading of a boolean ("false" is false); ``None``, ``auto`` (Ray: started when the image has
    it) and anything Ansible cannot read count as ``default`` (the value checks above name the unreadable)."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
        return default
    from ansible.module_utils.parsing.convert_bool import boolean  # noqa: PLC0415  (ansible's import)

    try:
        return bool(boolean(value, strict=True))
    except TypeError:
        return default
