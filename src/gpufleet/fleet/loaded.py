"""The fleet of one run: its inventory read once, validated once, and what a run derives from it.

:func:`load` reads the inventory with ansible-core's own loader
(:func:`~gpufleet.fleet.inventory.read_inventory`) and checks it (:func:`~gpufleet.fleet.validate.validate`)
into one frozen :class:`Fleet`. A run builds it once and passes it down: the CLI's plan, deploy()'s stages,
its validation and the endpoint its downtime meter polls all read the same object, where each once read the
inventory again.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from gpufleet.fleet.control import control_host
from gpufleet.fleet.inventory import read_inventory
from gpufleet.fleet.raw import RawInventory
from gpufleet.fleet.role_values import ansible_bool
from gpufleet.fleet.schema import FleetSpec
from gpufleet.fleet.validate import plan_request
from gpufleet.fleet.validate import validate as validate_raw
from gpufleet.problems import InventoryError, Problem

if TYPE_CHECKING:
    from gpufleet.planner import PlanRequest


class Endpoint(NamedTuple):
    """The service as a client reaches it: its /v1 URL and the file that holds its API key."""

    url: str
    key_file: Path


@dataclass(frozen=True)
class Fleet:
    """One inventory as a run sees it.

    ``raw`` is what Ansible resolved (None when it could not read the inventory at all: ``problems`` say
    why); ``spec`` the typed fleet when validation found no problem. ``validated`` is false for a fleet
    loaded with ``validate=False`` (status and teardown must work on a fleet that would not plan):
    :meth:`validate` checks it then, from the same reading.
    """

    path: Path
    raw: RawInventory | None
    spec: FleetSpec | None = None
    problems: tuple[Problem, ...] = ()
    warnings: tuple[str, ...] = ()
    validated: bool = False
    # The run's extra variables (-e), over every host's inventory values in ``raw`` (Ansible's precedence);
    # ``base`` is the inventory's own reading they were laid over.
    extra: Mapping[str, Any] = field(default_factory=dict)
    base: RawInventory | None = field(default=None, compare=False, repr=False)

    def with_extra_vars(self, extra: Mapping[str, Any] | None) -> Fleet:
        """This fleet as a run with these extra variables sees it (they win over the inventory on every host),
        to be checked again; itself when they are the ones it holds. A value that is a template (``{{``) is
        Ansible's to render at run time and is left out here."""
        wanted = {
            name: value
            for name, value in (extra or {}).items()
            if not (isinstance(value, str) and ("{{" in value or "{%" in value))
        }
        if wanted == dict(self.extra) or self.raw is None:
            return self
        base = self.base or self.raw
        hosts = tuple(replace(host, variables={**host.variables, **wanted}) for host in base.hosts)
        return Fleet(path=self.path, raw=replace(base, hosts=hosts), extra=wanted, base=base)

    def matching(self, pattern: str) -> list[str]:
        """The hosts an Ansible host pattern (``--limit``) selects, as ansible-core's InventoryManager reads
        it (names, groups, wildcards, ``~regex``, ``!``, ``&``); none for an inventory it could not read."""
        return self._selected([pattern])[0]

    def unmatched(self, pattern: str) -> list[str]:
        """The parts of a ``--limit`` pattern that select no host (a typo Ansible only warns about, then runs
        on the rest, or on nothing and reports success), else the whole pattern when together they select
        none (``all:!gpu_nodes``)."""
        from ansible.inventory.manager import split_host_pattern  # noqa: PLC0415

        parts = [part for part in split_host_pattern(pattern) if part and part[0] not in "!&@"]
        *each, whole = self._selected([*parts, pattern])
        unmatched = [part for part, hosts in zip(parts, each, strict=True) if not hosts]
        # every part selects hosts, and the exclusions (!) or intersections (&) leave none of them
        return unmatched or ([] if whole else [pattern])

    def _selected(self, patterns: list[str]) -> list[list[str]]:
        """The hosts each pattern selects, from one InventoryManager built from this reading."""
        if self.raw is None:
            return [[] for _ in patterns]
        from ansible.inventory.manager import InventoryManager  # noqa: PLC0415  (ansible's import)
        from ansible.parsing.dataloader import DataLoader  # noqa: PLC0415

        with contextlib.redirect_stderr(io.StringIO()):  # no "could not match" warnings: callers say it
            manager = InventoryManager(loader=DataLoader(), sources=[])
            for host in self.raw.hosts:
                for group in sorted(host.groups - {"all", "ungrouped"}) or ["ungrouped"]:
                    manager.add_group(group)
                    manager.add_host(host.name, group=group)
            manager._inventory.reconcile_inventory()  # what the parsing of a source ends with
            selected = []
            for pattern in patterns:
                manager.clear_pattern_cache()
                manager.subset(pattern)
                selected.append([host.name for host in manager.get_hosts("all")])
            return selected

    def validate(self) -> Fleet:
        """This fleet, checked (itself when it already is); never reads the inventory again."""
        if self.validated or self.raw is None:
            return replace(self, validated=True)
        result = validate_raw(self.raw)
        return replace(
            self,
            spec=result.fleet,
            problems=tuple(result.problems),
            warnings=tuple(result.warnings),
            validated=True,
        )

    def require(self) -> FleetSpec:
        """The typed fleet; InventoryError listing every problem when there is one."""
        checked = self.validate()
        if checked.problems or checked.spec is None:
            raise InventoryError(list(checked.problems))
        return checked.spec

    def plan_request(self) -> PlanRequest:
        """The planner's input for this fleet and its model; InventoryError when there is none."""
        request, problems = plan_request(self.require())
        if request is None:
            raise InventoryError(problems)
        return request

    @property
    def control(self) -> str | None:
        """The control host (:mod:`gpufleet.fleet.control`): group gpufleet_control's, else the Ray head's."""
        return control_host(self.raw) if self.raw is not None else None

    @property
    def lists_services(self) -> bool:
        """The inventory lists its models as services (``gpufleet_services``), not the one-model form."""
        return self.raw is not None and any("gpufleet_services" in host.variables for host in self.raw.hosts)

    @property
    def edge(self) -> Endpoint | None:
        """Services: where the gateway's edge answers - ``gateway_edge_host`` (default the head's cluster
        address), ``gateway_edge_port`` (default 8000) - and the key file (:attr:`endpoint`'s); None for one
        model, without an edge (``gateway_edge: false``) or when it is not knowable here."""
        heads = self.raw.members("ray_head") if self.raw is not None else []
        if self.spec is None or not self.spec.services or not heads or self.endpoint is None:
            return None
        variables: dict[str, Any] = dict(heads[0].variables)
        if not ansible_bool(variables.get("gateway_edge"), default=True):  # as the gateway role reads it
            return None
        host = str(variables.get("gateway_edge_host") or variables.get("gpufleet_node_ip", ""))
        port = str(variables.get("gateway_edge_port", 8000))
        if not host or "{{" in host or "{{" in port:
            return None
        return Endpoint(f"http://{host}:{port}/v1", self.endpoint.key_file)

    @property
    def endpoint(self) -> Endpoint | None:
        """Where the service answers and its key file, as the inventory sets them (None: not knowable here).

        The head's cluster address and ``vllm_service_port`` (or ``vllm_service_host`` when it names one
        address). The key file is ``gpufleet_api_key_file`` (or the role's ``vllm_service_api_key_file``),
        else ``gpufleet.apikey`` beside the inventory, where the vllm_service role keeps a generated key.
        """
        heads = self.raw.members("ray_head") if self.raw is not None else []
        if not heads:
            return None
        variables: dict[str, Any] = dict(heads[0].variables)
        host = str(variables.get("vllm_service_host", "0.0.0.0"))  # vLLM binds all addresses by default
        if host in ("0.0.0.0", "::"):
            host = str(variables.get("gpufleet_node_ip", ""))
        port = str(variables.get("vllm_service_port", 8000))
        if not host or "{{" in host:
            return None
        folder = self.path if self.path.is_dir() else self.path.parent
        key = variables.get("gpufleet_api_key_file") or variables.get("vllm_service_api_key_file")
        key_file = Path(str(key)) if key and "{{" not in str(key) else folder / "gpufleet.apikey"
        return Endpoint(f"http://{host}:{port}/v1", key_file)


def load(path: Path, *, validate: bool = True) -> Fleet:
    """Read the inventory once (and check it, unless ``validate`` is false); never raises for a bad
    inventory: the problems are in the result (:meth:`Fleet.require` raises them)."""
    try:
        raw = read_inventory(path)
    except InventoryError as error:
        return Fleet(path=path, raw=None, problems=tuple(error.problems), validated=True)
    fleet = Fleet(path=path, raw=raw)
    return fleet.validate() if validate else fleet


def load_fleet(path: Path) -> FleetSpec:
    """Read and validate an inventory; raises InventoryError listing every problem."""
    return load(path).require()


def plan_request_for_inventory(path: Path) -> PlanRequest:
    """The planner's input for an inventory's fleet and model; raises InventoryError."""
    return load(path).plan_request()
