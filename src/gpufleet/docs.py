"""Generate the README's reference sections (CLI and variables) from the code, so they stay true.

``python -m gpufleet.docs`` rewrites README.md between the ``<!-- BEGIN x -->`` / ``<!-- END x -->``
markers; a unit test fails when the README differs from what this would write.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from gpufleet.fleet.schema import INTERNAL_ROLES, VARIABLES, ServingSpec
from gpufleet.paths import project_root

FLEET_VARIABLE_DOCS: dict[str, str] = {
    "gpufleet_node_ip": "host: the node's cluster-network address (Ray, NCCL, Gloo, VLLM_HOST_IP). Required.",
    "gpufleet_nic": "host: the interface carrying gpufleet_node_ip (NCCL/GLOO_SOCKET_IFNAME). Required.",
    "gpufleet_gpu": "host: false on hosts without GPUs (the lab): GPU-only steps report and skip. "
    "Default true.",
    "gpufleet_gpu_count": "host: GPUs the host is expected to have. Default 1.",
    "gpufleet_gpu_model": "host: GPU model as nvidia-smi names it, e.g. `NVIDIA H800`.",
    "gpufleet_gpu_memory_gib": "host: memory of one GPU in GiB as CUDA reports it (default: from the model).",
    "gpufleet_model_repo": "ModelScope repository id, `<org>/<name>`. Required.",
    "gpufleet_model_revision": "Pinned revision (branch, tag or commit). Default `master`.",
    "gpufleet_model_dir": "Absolute path of the model on every node (the same on all). Required.",
    "gpufleet_model_config": "Control-node path of the model's config.json, for the planner "
    "(relative to the inventory). Default: from the bundle when there is one.",
    "gpufleet_bundle_dir": "Control-node path of an offline bundle; set = never contact the internet.",
    "gpufleet_bundle_signers": "Control-node path of an ssh-keygen allowed-signers file (relative to the "
    "inventory). Set, preflight refuses a bundle whose bundle.lock.yml is unsigned, changed after signing or "
    "signed by a key the file does not list (`gpufleet bundle sign`). Default: no signature required.",
    "gpufleet_api_key_file": "Control-node file holding the API key (generated, mode 0600).",
    "gpufleet_lab": "Set by `gpufleet lab up` in lab inventories.",
    "gpufleet_monitoring": "true runs the optional monitoring stage (role monitoring: Prometheus, "
    "node_exporter, Grafana, dcgm-exporter); inventories/prod sets it. Default false.",
    "gpufleet_grafana_password_file": "Control-node file holding Grafana's admin password (generated, "
    "mode 0600). Default `gpufleet.grafana-password` beside the inventory.",
    "gpufleet_cuda_forward_compat": "true when every node has NVIDIA's CUDA forward-compatibility package: "
    "validation then accepts an image whose CUDA is newer than the driver's, on datacenter GPUs only. "
    "Default false.",
    "gpufleet_services": "The models the fleet serves, each as replicas placed on the nodes' GPUs: a list of "
    "`{name, model: {repo, revision, dir, config}, replicas: N or auto, hosts: [nodes or groups], image: a "
    "Docker reference (what its replicas run, each in a container of its own; default the fleet's "
    'ray_cluster_image), serving: {vllm_service_* settings without the prefix}}` (README "Services"), or, '
    "instead of replicas and hosts, `pd: {connector, kv_transfer, side_channel_port, ucx_net_devices, "
    'prefill: {replicas, hosts, serving}, decode: {replicas, hosts, serving}}` (README "Prefill/decode '
    'disaggregation"). Unset: '
    "the `gpufleet_model_*` and `vllm_service_*` variables are one service with one replica over every GPU. "
    "`gpufleet plan` and `validate` place and plan it; deploy serves each replica behind a router per "
    "service.",
    "gpufleet_fast_rerun": "true (the default) lets each role skip its work on a node still as its last "
    "run left it (a recorded digest of the role's inputs and the node state it manages: files, units, image "
    "IDs); false makes every role run every task, and so does GPUFLEET_FAST_RERUN=false in the environment.",
}


SERVING_FLAGS = {"kv_cache_memory_gib": "--kv-cache-memory` (given here in GiB)"}


def _serving_doc(field_name: str) -> str:
    info = ServingSpec.model_fields[field_name]
    default = "none" if info.default is None else f"`{info.default}`"
    flag = SERVING_FLAGS.get(field_name, f"--{field_name.replace('_', '-')}`")
    return f"vLLM `{flag}. Default {default}."


def variables_section(root: Path) -> str:
    lines = ["| variable | meaning |", "| --- | --- |"]
    for name, variable in VARIABLES.items():
        doc = _serving_doc(variable.field) if variable.section == "serving" else FLEET_VARIABLE_DOCS[name]
        lines.append(f"| `{name}` | {doc} |")
    lines += [
        f"| `{name}` | {FLEET_VARIABLE_DOCS[name]} |"
        for name in (
            "gpufleet_bundle_signers",
            "gpufleet_api_key_file",
            "gpufleet_cuda_forward_compat",
            "gpufleet_fast_rerun",
            "gpufleet_services",
        )
    ]
    for spec_file in sorted(root.glob("roles/*/meta/argument_specs.yml")):
        role = spec_file.parent.parent.name
        if role in INTERNAL_ROLES:
            continue  # other roles set its options; an inventory does not (roles/<role>/README.md)
        specs: dict[str, Any] = yaml.safe_load(spec_file.read_text(encoding="utf-8")) or {}
        options: dict[str, Any] = (specs.get("argument_specs", {}).get("main") or {}).get("options") or {}
        documented = [name for name in options if name not in VARIABLES]
        if not documented:
            continue
        lines += [
            "",
            f"Role [`{role}`](roles/{role}/README.md):",
            "",
            "| variable | default | meaning |",
            "| --- | --- | --- |",
        ]
        for name in documented:
            option = options[name] or {}
            description = " ".join(_as_list(option.get("description", "")))
            default = option.get("default", "required" if option.get("required") else "none")
            cells = (f"`{default}`", description)
            lines.append(f"| `{name}` | " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines)


def _as_list(value: Any) -> list[str]:
    return [str(item) for item in value] if isinstance(value, list) else [str(value)]


def cli_section() -> str:
    from gpufleet.cli import build_parser  # noqa: PLC0415  (cli imports every command module)

    os.environ["COLUMNS"] = "100"  # argparse wraps help to the terminal: fix the width for a stable README
    parser = build_parser()
    blocks: list[str] = []
    for action in parser._subparsers._group_actions if parser._subparsers else []:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        for name, sub in action.choices.items():
            blocks.append(f"### `gpufleet {name}`\n\n```\n{_help(sub)}```")
    return "\n\n".join(blocks)


def _help(parser: argparse.ArgumentParser) -> str:
    text = parser.format_help()
    for action in parser._subparsers._group_actions if parser._subparsers else []:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                text += "\n" + sub.format_help()
    return text


def render(readme: str, root: Path) -> str:
    for marker, body in (("VARIABLES", variables_section(root)), ("CLI", cli_section())):
        pattern = re.compile(rf"(<!-- BEGIN {marker} -->\n).*?(<!-- END {marker} -->)", re.S)
        readme = pattern.sub(_replacement(body), readme)
    return readme


def _replacement(body: str) -> Callable[[re.Match[str]], str]:
    return lambda match: f"{match.group(1)}{body}\n{match.group(2)}"


def main() -> int:
    root = project_root()
    if root is None:
        print("gpufleet.docs: run from a gpufleet checkout (site.yml and roles/ not found)", file=sys.stderr)
        return 2
    readme = root / "README.md"
    readme.write_text(render(readme.read_text(encoding="utf-8"), root), encoding="utf-8")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
