"""Lookup plugin ``gpufleet_inputs``: one digest of everything a role's converge depends on.

The other half of ``gpufleet_converged``: the node's stamp holds this digest from the role's last converge,
so a role is skipped only while its inputs are what they were. The digest is deliberately broad: the
role's own files (tasks, templates, defaults, vars), the collection's modules and their shared code
(module_utils), every variable named with the given prefixes (the role's inputs and the fleet-wide
``gpufleet_*`` ones, from the inventory, extra vars and defaults alike), and whatever else the caller names
(other hosts' addresses, group membership). A variable the role does not read only costs a converge when it
changes; one it reads and the digest missed would leave a node unconverged, so prefixes, not lists, select
them.

With ``fleet=true`` it digests a whole deploy instead (playbooks/fleet_check.yml): the collection's
roles, plugins and playbooks, every inventory host's variables named with a role's prefix or ``gpufleet_``,
the groups, and the contents of the control node's files the deploy reads (the bundle's lock, the API key).
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: gpufleet_inputs
author: gpufleet maintainers (@gpufleet)
short_description: Digest a role's inputs, for gpufleet_converged
description:
  - Returns the sha256 of the calling role's files (but its Markdown docs), the collection's modules and
    their module_utils, the values of every variable whose name starts with one of the given prefixes
    (names starting with C(__), which are registered results and internals, and the run-time facts in
    I(exclude) left out) and I(extra).
  - Must be called from inside a role (it reads C(role_path)), unless I(fleet) is true.
  - With I(fleet=true), the digest of a whole deploy instead, for the fleet stamp
    (playbooks/fleet_check.yml), over the collection's roles, plugins and playbooks (but docs and Molecule
    scenarios), the variables of every host in I(hosts) named with one of the given prefixes, C(gpufleet_)
    or a role's name and C(_), the groups, the contents of I(files) and I(extra).
options:
  _terms:
    description: Variable name prefixes, for example C(docker_) and C(gpufleet_).
    type: list
    elements: str
    required: false
  fleet:
    description: Digest a whole deploy (every host's variables, the whole collection), not one role's inputs.
    type: bool
    default: false
  hosts:
    description: With I(fleet), the hosts whose variables count (default every host of the inventory).
    type: list
    elements: str
    default: []
  files:
    description: With I(fleet), control-node files whose contents count (a missing one counts as missing).
    type: list
    elements: path
    default: []
  extra:
    description: Any further values the converge depends on (other hosts' variables, groups).
    type: raw
    default: null
  exclude:
    description: Further variable names left out (the facts the roles publish are always left out).
    type: list
    elements: str
    default: []
  serving:
    description:
      - Whether what the fleet serves counts (C(gpufleet_services), the one-model form's
        C(gpufleet_model_*)).
      - False for the roles that make a host ready and never read it (Docker, the driver, CUDA, the container
        toolkit, the images). A model added or a service raised then leaves their converge alone;
        tests/unit/test_converged_lookup.py checks that such a role names none of those variables.
    type: bool
    default: true
notes:
  - Runs on the control node; values that cannot be templated count by their error, so they still matter.
"""

EXAMPLES = r"""
- name: Digest the docker role's inputs
  ansible.builtin.debug:
    msg: "{{ lookup('gpufleet.gpufleet.gpufleet_inputs', 'docker_', 'gpufleet_', extra=groups) }}"
"""

RETURN = r"""
_raw:
  description: >-
    One sha256, 64 lowercase hex digits; with I(fleet=true), a dict of C(digest) and C(parts) (the sha256 of
    each of trees, hosts, groups, files and extra, of which C(digest) is the sha256).
  type: list
  elements: str
"""

import hashlib
import json
import os
from functools import cache
from typing import Any

from ansible.errors import AnsibleError
from ansible.plugins.lookup import LookupBase

# Facts the roles publish under input-like names: they differ from run to run (or exist only after the
# role ran), so they are results, not inputs. tests/unit/test_converged_lookup.py keeps this list complete.
RUN_TIME_FACTS = (
    "cuda_toolkit_installed_version",
    "gateway_endpoint",
    "gateway_report",
    "gpufleet_endpoint",
    "gpufleet_gateway",
    "gpufleet_gateway_edge",
    "gpufleet_gateway_endpoint",
    "gpufleet_monitoring_endpoints",
    "gpufleet_nodes",
    "gpufleet_ray_gpus",
    "gpufleet_ray_nodes_alive",
    "gpufleet_ray_nodes_expected",
    "gpufleet_ray_nodes_missing",
    "gpufleet_replica_changing",
    "gpufleet_replica_checks",
    "gpufleet_replica_gates",
    "gpufleet_replica_restored",
    "gpufleet_replica_revisions",
    "gpufleet_replica_states",
    "gpufleet_replicas",
    "gpufleet_revisions",
    "gpufleet_rollback",
    "gpufleet_rolling",
    "gpufleet_service_load",
    "gpufleet_verify",
    "gpufleet_vllm_facts",
    "gpufleet_vllm_ready",
    "nvidia_driver_cuda_version",
    "nvidia_driver_cuda_version_source",
    "nvidia_driver_installed_version",
    "preflight_gpus",
    "ray_cluster_alive_nodes",
    "ray_cluster_report",
    "relay_probe_reached",
    "vllm_service_checked",
    "vllm_service_gate_result",
    "vllm_service_revision_live",
    "vllm_service_instance",
    "vllm_service_restored",
)
_PLUGINS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_MODULES = os.path.join(_PLUGINS, "modules")
_MODULE_UTILS = os.path.join(_PLUGINS, "module_utils")  # the modules' shared code: it runs with them
# The collection's root (a checkout, or ansible_collections/gpufleet/gpufleet installed): what a deploy runs.
_COLLECTION = os.path.dirname(_PLUGINS)
# What the fleet serves: the variables a role called with serving=false leaves out (a prefix ends with _)
SERVING = ("gpufleet_services", "gpufleet_model_")
# The group playbooks/fleet_check.yml fills when every node is in sync: a result, not an input.
FAST_GROUP = "gpufleet_in_sync"
# Groups a run makes for itself (playbooks/serving_form.yml sorts the nodes by serving form): results of the
# inventory, not inputs; a digest taken after them must be the one taken before.
RUN_TIME_GROUPS = frozenset(
    {
        FAST_GROUP,
        "gpufleet_serve_one_model",
        "gpufleet_serve_services",
        "gpufleet_serve_parallel",
        "gpufleet_serve_rolling",
    }
)


@cache
def tree_digest(root: str) -> str:
    """sha256 over every file's relative path and bytes but the docs. Ansible runs a lookup in the forked
    worker of one task and host, so this runs once per check and record (a role: tens of small files)."""
    digest = hashlib.sha256()
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in {"__pycache__", "molecule"})
        for name in sorted(name for name in files if not name.endswith(".md")):  # docs change nothing
            path = os.path.join(folder, name)
            digest.update(os.path.relpath(path, root).encode() + b"\0")
            with open(path, "rb") as src:
                digest.update(hashlib.sha256(src.read()).digest())
    return digest.hexdigest()


def _sha256(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def file_digest(path: str) -> str | None:
    try:
        with open(path, "rb") as src:
            return hashlib.sha256(src.read()).hexdigest()
    except FileNotFoundError:
        return None


class LookupModule(LookupBase):  # type: ignore[misc]  # ansible-core ships no type information
    def run(self, terms: list[Any], variables: dict[str, Any] | None = None, **kwargs: Any) -> list[Any]:
        self.set_options(var_options=variables, direct=kwargs)
        variables = variables or {}
        if self.get_option("fleet"):
            return [self._fleet(variables, tuple(str(term) for term in terms))]
        role_path = variables.get("role_path")
        if not role_path:
            raise AnsibleError("gpufleet_inputs: call it from inside a role (role_path is not set)")
        names = self._input_names(variables, tuple(str(term) for term in terms))
        values = {name: self._value(variables, name) for name in names}
        inputs = {
            "role": tree_digest(str(role_path)),
            "modules": tree_digest(_MODULES) if os.path.isdir(_MODULES) else "",
            "module_utils": tree_digest(_MODULE_UTILS) if os.path.isdir(_MODULE_UTILS) else "",
            "vars": values,
            "extra": self._plain(self.get_option("extra")),
        }
        encoded = json.dumps(inputs, sort_keys=True, default=str).encode()
        return [hashlib.sha256(encoded).hexdigest()]

    def _fleet(self, variables: dict[str, Any], terms: tuple[str, ...]) -> dict[str, Any]:
        roles = os.path.join(_COLLECTION, "roles")
        role_names = sorted(os.listdir(roles)) if os.path.isdir(roles) else []
        prefixes = (*terms, "gpufleet_", *(f"{role}_" for role in role_names))
        groups = {
            name: sorted(hosts)
            for name, hosts in variables.get("groups", {}).items()
            if name not in RUN_TIME_GROUPS
        }
        hostvars = variables.get("hostvars", {})
        hosts: dict[str, Any] = {}
        for host in sorted(self.get_option("hosts") or groups.get("all", [])):
            own = hostvars[host]
            hosts[host] = {name: self._host_value(own, name) for name in self._input_names(own, prefixes)}
        inputs = {
            "trees": {
                tree: tree_digest(os.path.join(_COLLECTION, tree))
                for tree in ("roles", "plugins", "playbooks")
                if os.path.isdir(os.path.join(_COLLECTION, tree))
            },
            "hosts": hosts,
            "groups": groups,
            "files": {path: file_digest(path) for path in self.get_option("files")},
            "extra": self._plain(self.get_option("extra")),
        }
        parts = {name: _sha256(value) for name, value in inputs.items()}
        return {"digest": _sha256(parts), "parts": parts}

    def _input_names(self, variables: Any, prefixes: tuple[str, ...]) -> list[str]:
        """The inputs among ``variables``' names: one of the prefixes, but internals (``__``, registered
        results) and the facts the roles publish (results, not inputs)."""
        excluded = {*RUN_TIME_FACTS, *self.get_option("exclude")}
        serving = () if self.get_option("serving") else SERVING
        return sorted(
            name
            for name in variables
            if name.startswith(prefixes)
            and not name.startswith("__")
            and name not in excluded
            and not any(name == left or (left.endswith("_") and name.startswith(left)) for left in serving)
        )

    def _host_value(self, own: Any, name: str) -> Any:
        try:
            return self._plain(own[name])  # hostvars template on access, in that host's context
        except Exception as problem:
            return f"<{type(problem).__name__}>"

    def _value(self, variables: dict[str, Any], name: str) -> Any:
        try:
            return self._plain(self._templar.template(variables[name]))
        except Exception as problem:
            return f"<{type(problem).__name__}>"

    @staticmethod
    def _plain(value: Any) -> Any:
        """JSON-safe and order-independent, whatever Ansible's wrapper types."""
        return json.loads(json.dumps(value, sort_keys=True, default=str))
