"""``gpufleet plan -i`` for an inventory with services: the placement, each replica planned on its own GPUs.

A table of every replica (service, replica, node, GPUs, weights, KV tokens, max concurrency) and one row per
service with its totals; ``--json`` carries the same, one entry per replica with its node and
``kv_cache_tokens`` (and the replica's whole plan under ``plan``).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from gpufleet.commands.output import refuse
from gpufleet.fleet.services import VARIABLE, model_config, place_fleet, replica_requests, services_of
from gpufleet.planner import Plan, PlannerInputError, load_model_config, plan
from gpufleet.planner.placement import Placement, PlacementError

if TYPE_CHECKING:
    from gpufleet.fleet.schema import FleetSpec


def run_services(fleet: FleetSpec, caveats: list[str], *, as_json: bool) -> int:
    """Exit 0 when every replica should start, 1 when one would not (or cannot be placed or planned)."""
    try:
        placement = place_fleet(fleet)
    except PlacementError as error:
        return refuse([str(problem) for problem in error.problems], code=1, as_json=as_json)
    configs: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    for service in services_of(fleet):
        path = model_config(fleet, service.model)
        if path is None:
            problems.append(
                f"{VARIABLE}: {service.name}: model.config: found nothing; expected the model's config.json "
                "on this machine. Fix: set model.config (a copy of the model's config.json is enough)"
            )
            continue
        try:
            configs[service.name] = load_model_config(path)
        except PlannerInputError as error:
            problems.append(f"{VARIABLE}: {service.name}: model.config: {error}")
    if problems:
        return refuse(problems, code=1, as_json=as_json)
    plans: dict[str, Plan] = {}
    for replica_id, request in replica_requests(fleet, placement, configs).items():
        try:
            plans[replica_id] = plan(request)
        except PlannerInputError as error:
            return refuse([f"{replica_id}: {error}"], code=1, as_json=as_json)
    failed = any(result.errors for result in plans.values())
    if as_json:
        print(json.dumps(placement_json(placement, plans, caveats), indent=2))
    else:
        render(placement, plans, caveats)
    return 1 if failed else 0


def placement_json(placement: Placement, plans: dict[str, Plan], caveats: list[str]) -> dict[str, Any]:
    replicas: list[dict[str, Any]] = []
    for replica in placement.replicas:
        result = plans.get(replica.id)
        replicas.append(
            {
                "service": replica.service,
                "replica": replica.id,
                "node": replica.node,
                "members": [{"node": m.node, "gpus": list(m.gpus)} for m in replica.members],
                "executor": replica.executor,
                "port": replica.port,
                "kv_cache_tokens": result.kv_cache_tokens if result else None,
                "max_concurrency": result.max_concurrency if result else None,
                "plan": result.to_json_dict() if result else None,
            }
        )
    services: dict[str, dict[str, Any]] = {}
    for entry in replicas:
        total = services.setdefault(entry["service"], {"replicas": 0, "kv_cache_tokens": 0})
        total["replicas"] += 1
        total["kv_cache_tokens"] += entry["kv_cache_tokens"] or 0
    errors = [f"{rid}: {error}" for rid, result in plans.items() for error in result.errors]
    warnings = [f"{rid}: {warning}" for rid, result in plans.items() for warning in result.warnings]
    return {
        "replicas": replicas,
        "services": [{"name": name, **total} for name, total in services.items()],
        "errors": errors,
        "warnings": [*warnings, *caveats],
    }


def render(placement: Placement, plans: dict[str, Plan], caveats: list[str]) -> None:
    from rich.console import Console  # noqa: PLC0415  (rich loads only when something is shown)
    from rich.table import Table  # noqa: PLC0415
    from rich.text import Text  # noqa: PLC0415

    console = Console()
    table = Table(title="Placement: every replica on its own GPUs")
    for column in ("service", "replica", "node", "GPUs", "weights GiB/GPU", "KV tokens", "max concurrency"):
        table.add_column(column, justify="right" if column[0].isupper() or " " in column else "left")
    for replica in placement.replicas:
        result = plans.get(replica.id)
        gpus = ", ".join(f"{m.node}:{','.join(map(str, m.gpus)) or 'cpu'}" for m in replica.members)
        table.add_row(
            replica.service,
            replica.id,
            replica.node,
            gpus,
            f"{result.weights_gib_per_gpu:.2f}" if result else "-",
            f"{result.kv_cache_tokens:,}" if result else "-",
            f"{result.max_concurrency:.1f}" if result else "-",
        )
    console.print(table)
    totals = placement_json(placement, plans, caveats)
    for service in totals["services"]:
        console.print(
            f"{service['name']}: {service['replicas']} replica(s), {service['kv_cache_tokens']:,} KV tokens",
            highlight=False,
        )
    for warning in totals["warnings"]:
        console.print(Text.assemble(("warning: ", "yellow"), warning))
    for error in totals["errors"]:
        console.print(Text.assemble(("error: ", "red"), error))
    if not totals["errors"]:
        console.print("vLLM should start every replica with these settings.", highlight=False)
