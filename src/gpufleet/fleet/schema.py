"""The fleet schema: frozen pydantic models built from an Ansible inventory.

The inventory is the single source of truth; these models are its typed, validated view. Every model
forbids extra keys, so a misspelt variable is an error rather than a silent default. Each field knows the
inventory variable it comes from (``VARIABLES``), so that messages name what the user wrote.
"""

from __future__ import annotations

import ipaddress
import math
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    IPvAnyAddress,
    NonNegativeInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

# Linux interface names: at most 15 bytes (IFNAMSIZ - 1), no slash or whitespace.
NIC_PATTERN = r"^[A-Za-z0-9_.:@-]{1,15}$"
# A DNS host name (RFC 1123 labels), what ansible_host may hold instead of an address.
HOST_NAME = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*"
)
# Control characters: in no name, path or model of the inventory (a newline, a tab, an escape).
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# A ModelScope (or Hugging Face) repository id: "<org>/<name>".
REPO_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$"

Dtype = Literal["auto", "half", "float16", "bfloat16", "float", "float32"]
KvCacheDtype = Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"]
BlockSize = Literal[1, 8, 16, 32, 64, 128]  # BLOCK_SIZES (vLLM's choices); a unit test keeps them equal
Quantization = Literal["awq", "gptq", "bitsandbytes", "fp8"]


def _numeric(annotation: Any) -> bool:
    """int, float, their Optional, or a Literal of numbers (bool excluded: it is an int to Python)."""
    if annotation in (int, float):
        return True
    args = get_args(annotation)
    if get_origin(annotation) is Literal:
        return all(isinstance(arg, int | float) and not isinstance(arg, bool) for arg in args)
    return any(_numeric(arg) for arg in args) and bool not in args


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        """YAML's true/false is not a port or a size (pydantic would take true as 1)."""
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(value, bool) and field is not None and _numeric(field.annotation):
            raise ValueError("a number, not true/false")
        if isinstance(value, float) and not math.isfinite(value):  # YAML's .inf/.nan pass ge= checks
            raise ValueError("a finite number, not .inf or .nan")
        control = CONTROL.search(value) if isinstance(value, str) else None  # a newline in a path, an escape
        if control is not None:
            raise ValueError(f"text without control characters (found {control[0]!r})")
        return value


class GpuSpec(_Frozen):
    """The GPUs a host is expected to have; preflight compares them with what the host reports."""

    count: int = Field(default=1, ge=0, le=64)
    model: str | None = None
    memory_gib: float | None = Field(default=None, gt=0, le=1024)


class NodeSpec(_Frozen):
    """One host of group ``gpu_nodes``."""

    name: str
    ansible_host: str  # an IP address, or a host name SSH resolves

    @field_validator("ansible_host")
    @classmethod
    def _address_or_name(cls, value: str) -> str:
        expected = "an IP address or a host name (letters, digits, '-', '.')"
        try:
            if re.fullmatch(r"[0-9.]+", value):  # written as an IPv4 address: it must be one
                ipaddress.IPv4Address(value)
            elif ":" in value:
                ipaddress.IPv6Address(value)
            elif not HOST_NAME.fullmatch(value):
                raise ValueError(expected)
        except ValueError:
            raise ValueError(expected) from None
        return value

    node_ip: IPvAnyAddress

    @field_validator("node_ip", mode="before")
    @classmethod
    def _written_as_text(cls, value: Any) -> Any:
        """YAML reads an unquoted ``1:2:3`` as a base-60 integer, which pydantic takes as an IPv4 address."""
        if isinstance(value, int | float):
            raise ValueError(
                f"an IP address written as text; YAML read a number ({value}): an unquoted address with "
                "colons (IPv6) is a base-60 integer to YAML 1.1. Quote it"
            )
        return value

    @field_validator("node_ip")
    @classmethod
    def _reachable(cls, value: ipaddress.IPv4Address | ipaddress.IPv6Address) -> Any:
        """The address the other nodes reach this one at (Ray, NCCL, the relays): one of its own, on a NIC.
        An IPv4-mapped IPv6 address (``::ffff:127.0.0.1``) is judged as the IPv4 address it maps."""
        mapped = getattr(value, "ipv4_mapped", None)
        value = mapped if mapped is not None else value
        kind = next(
            (
                name
                for name, test in (
                    ("unspecified", value.is_unspecified),
                    ("loopback", value.is_loopback),
                    ("multicast", value.is_multicast),
                    ("broadcast", str(value) == "255.255.255.255"),
                    # fe80::/10 needs a zone (%eth0) no peer can use; 169.254/16: a NIC's when none was set
                    ("link-local", value.is_link_local),
                )
                if test
            ),
            None,
        )
        if kind is not None:
            raise ValueError(
                f"the address of this node on the cluster network, not a {kind} one ({value}): the other "
                "nodes reach it there (`ip -brief address` on the node lists its addresses)"
            )
        return value

    nic: str = Field(pattern=NIC_PATTERN)
    gpu: bool = True
    gpus: GpuSpec
    role: Literal["head", "worker"]


# Directories a model must never be (model_fetch writes DIR.gpufleet-incoming and renames it over DIR), and
# top-level trees it must never be in. roles/model_fetch/vars/main.yml holds the same lists for the role's own
# check on the hosts (a unit test keeps them equal).
SYSTEM_DIRS = (
    "/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/media", "/mnt", "/opt",
    "/proc", "/root", "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr", "/usr/bin", "/usr/lib", "/usr/local",
    "/usr/sbin", "/usr/share", "/var", "/var/lib", "/var/log", "/var/tmp",
)  # fmt: skip
SYSTEM_TREES = ("/boot", "/dev", "/etc", "/proc", "/run", "/sys")


class ModelSpec(_Frozen):
    """The model every node serves, fetched to the same path on each of them."""

    repo: str = Field(pattern=REPO_PATTERN)
    revision: str = Field(default="master", min_length=1)
    dir: str
    config: Path | None = None

    @field_validator("dir")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("an absolute path on the nodes, such as /opt/models/<name>")
        if ".." in value.split("/"):
            raise ValueError(
                f"a path without '..' parts (found {value!r}; it names {posixpath.normpath(value)}): write "
                "the directory itself"
            )
        normal = "/" + posixpath.normpath(value).lstrip("/")  # normpath keeps a leading "//"; the kernel not
        if normal in SYSTEM_DIRS or any(normal.startswith(tree + "/") for tree in SYSTEM_TREES):
            raise ValueError(
                f"a directory of the model's own, such as /opt/models/<name>, not {normal}: model_fetch "
                "replaces the directory with the model"
            )
        return value


class ServingSpec(_Frozen):
    """vLLM's serving settings (inputs of the ``vllm_service`` role)."""

    tensor_parallel_size: int = Field(default=1, ge=1, le=512)
    pipeline_parallel_size: int = Field(default=1, ge=1, le=512)
    max_model_len: int | None = Field(default=None, gt=0)
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    block_size: BlockSize = 16
    dtype: Dtype = "auto"
    kv_cache_dtype: KvCacheDtype = "auto"
    quantization: Quantization | None = None
    cpu_offload_gb: float = Field(default=0.0, ge=0)
    max_num_batched_tokens: int | None = Field(default=None, gt=0)
    max_num_seqs: int | None = Field(default=None, gt=0)
    kv_cache_memory_gib: float | None = Field(default=None, gt=0)
    enforce_eager: bool = False
    enable_expert_parallel: bool = False  # --enable-expert-parallel: MoE experts spread whole over the ranks
    # --limit-mm-per-prompt: items per prompt by modality; every modality at 0 = no vision tower (planner)
    limit_mm_per_prompt: dict[str, NonNegativeInt] | None = None
    served_model_name: str | None = Field(default=None, min_length=1)
    port: int = Field(default=8000, ge=1, le=65535)

    @field_validator("limit_mm_per_prompt", mode="before")
    @classmethod
    def _mm_counts(cls, value: object) -> object:
        """vLLM takes items per modality or ``{count: N, ...}`` per modality; the planner needs the count."""
        if isinstance(value, dict):
            return {key: item.get("count") if isinstance(item, dict) else item for key, item in value.items()}
        return value

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size


# A service's name: its replicas' instance ids are <name>-<index> (vllm_service_instance_id: 1-32 of
# [a-z0-9-]).
SERVICE_NAME = r"^[a-z0-9](?:[a-z0-9-]{0,26}[a-z0-9])?$"
# A Docker image reference: [registry[:port]/]name[:tag][@sha256:digest], lowercase name components
IMAGE_REFERENCE = (
    r"^(?:[A-Za-z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:[._-]+[a-z0-9]+)*(?:/[a-z0-9]+(?:[._-]+[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$"
)


def _replica_count(most: int) -> AfterValidator:
    """A number of replicas from 1 to ``most`` (``auto`` passes: as many as fit)."""

    def check(value: int | str) -> int | str:
        if isinstance(value, int) and not 1 <= value <= most:
            raise ValueError(f"a number of replicas from 1 to {most}, or auto (as many as fit)")
        return value

    return AfterValidator(check)


PD_ROLES = ("prefill", "decode")
# Settings both roles of a P/D service share (on the service, not on a role): the connector copies KV-cache
# blocks as they are (block size, KV-cache dtype, dtype), decode continues what prefill started (the context
# length), and clients reach both under one name.
PD_SHARED = ("block_size", "kv_cache_dtype", "dtype", "max_model_len", "served_model_name")


class PdRoleSpec(_Frozen):
    """One role (prefill or decode) of a P/D service: its replicas, where, and the settings only it has."""

    replicas: Annotated[int | Literal["auto"], _replica_count(99)] = 1  # ids <service>-p<index>: 2 digits
    hosts: tuple[str, ...] | None = Field(default=None, min_length=1)
    serving: ServingSpec = ServingSpec()  # what it sets overlays the service's serving (PD_SHARED excepted)

    @model_validator(mode="after")
    def _not_shared(self) -> PdRoleSpec:
        shared = sorted(set(PD_SHARED) & self.serving.model_fields_set)
        if shared:
            raise ValueError(
                f"{', '.join(shared)} on the service's serving, not on a role: both roles must agree "
                "(the connector copies KV-cache blocks as they are)"
            )
        return self


class PdSpec(_Frozen):
    """Prefill/decode disaggregation of one service (issue 39): its prefill replicas compute each prompt and
    hand the KV cache over the connector to a decode replica, which generates; the service's vllm-router runs
    in P/D mode (``--vllm-pd-disaggregation``) behind the gateway like any other service's."""

    connector: Literal["NixlConnector"] = "NixlConnector"  # the one vllm-router's P/D mode reaches by URL
    # false: TEST ONLY (the lab's CPU image has no connector): decode computes the prompt again
    kv_transfer: bool = True
    side_channel_port: int = Field(default=5600, ge=1024, le=65535)  # NIXL's, per replica and TP rank
    ucx_net_devices: str | None = Field(default=None, min_length=1)  # UCX_NET_DEVICES (None: UCX chooses)
    prefill: PdRoleSpec = PdRoleSpec()
    decode: PdRoleSpec = PdRoleSpec()

    def role(self, name: str) -> PdRoleSpec:
        return self.prefill if name == "prefill" else self.decode


class ServiceSpec(_Frozen):
    """One model the fleet serves, as replicas of one shape (fleet/services.py, ``gpufleet_services``), or
    as prefill and decode replicas (``pd``)."""

    name: str = Field(pattern=SERVICE_NAME)  # what clients send as `model` (unless serving names another)
    model: ModelSpec
    replicas: Annotated[int | Literal["auto"], _replica_count(1024)] = 1
    hosts: tuple[str, ...] | None = Field(default=None, min_length=1)  # nodes (groups already expanded)
    serving: ServingSpec = ServingSpec()
    # the image its replicas run (each in its own container); None = the fleet's (ray_cluster_image)
    image: str | None = None
    pd: PdSpec | None = None  # prefill and decode replicas instead of `replicas` and `hosts`

    @model_validator(mode="after")
    def _pd_alone(self) -> ServiceSpec:
        if self.pd is not None:
            both = sorted({"replicas", "hosts"} & self.model_fields_set)
            if both:
                raise ValueError(
                    f"{' and '.join(both)} beside pd: a P/D service sets them per role "
                    "(pd.prefill.replicas, pd.decode.hosts, ...)"
                )
        return self

    def serving_of(self, role: str | None) -> ServingSpec:
        """The settings of a replica of ``role`` (None: a service without roles): the service's, overlaid
        with what the role sets."""
        if self.pd is None or role is None:
            return self.serving
        overlay = self.pd.role(role).serving
        return self.serving.model_copy(
            update={name: getattr(overlay, name) for name in overlay.model_fields_set}
        )

    @field_validator("image")
    @classmethod
    def _image_reference(cls, value: str | None) -> str | None:
        if value is not None and (len(value) > 255 or not re.match(IMAGE_REFERENCE, value)):
            raise ValueError(
                "a Docker image reference such as vllm/vllm-openai:v0.24.0 (name[:tag][@sha256:digest])"
            )
        return value


class FleetSpec(_Frozen):
    """A whole validated inventory."""

    nodes: tuple[NodeSpec, ...]
    model: ModelSpec
    serving: ServingSpec
    services: tuple[ServiceSpec, ...] = ()  # empty: the inventory before services (one model, one instance)
    bundle_dir: Path | None = None
    inventory: Path

    @model_validator(mode="after")
    def _one_head(self) -> FleetSpec:
        if sum(node.role == "head" for node in self.nodes) != 1:
            raise ValueError("exactly one node in group ray_head")
        return self

    @property
    def head(self) -> NodeSpec:
        return next(node for node in self.nodes if node.role == "head")

    @property
    def workers(self) -> tuple[NodeSpec, ...]:
        return tuple(node for node in self.nodes if node.role == "worker")

    @property
    def inventory_dir(self) -> Path:
        """The directory relative paths in the inventory (model config, bundle) are relative to."""
        return self.inventory if self.inventory.is_dir() else self.inventory.parent

    @property
    def total_gpus(self) -> int:
        return sum(node.gpus.count for node in self.nodes)


@dataclass(frozen=True)
class Variable:
    """Where an inventory variable lands in the models."""

    name: str
    section: Literal["node", "gpus", "model", "serving", "fleet"]
    field: str
    per_host: bool


def _variables() -> dict[str, Variable]:
    table = [
        Variable("gpufleet_node_ip", "node", "node_ip", True),
        Variable("gpufleet_nic", "node", "nic", True),
        Variable("gpufleet_gpu", "node", "gpu", True),
        Variable("gpufleet_gpu_count", "gpus", "count", True),
        Variable("gpufleet_gpu_model", "gpus", "model", True),
        Variable("gpufleet_gpu_memory_gib", "gpus", "memory_gib", True),
        Variable("gpufleet_model_repo", "model", "repo", False),
        Variable("gpufleet_model_revision", "model", "revision", False),
        Variable("gpufleet_model_dir", "model", "dir", False),
        Variable("gpufleet_model_config", "model", "config", False),
        Variable("gpufleet_bundle_dir", "fleet", "bundle_dir", False),
    ]
    table += [Variable(f"vllm_service_{f}", "serving", f, False) for f in ServingSpec.model_fields]
    return {variable.name: variable for variable in table}


# Every variable the Python side reads; roles add their own through meta/argument_specs.yml.
VARIABLES: dict[str, Variable] = _variables()
# Variables gpufleet reads from the inventory that belong to no model (the runner and roles use them).
FLEET_ONLY_VARIABLES = frozenset(
    {
        "gpufleet_api_key_file",
        "gpufleet_lab",
        "gpufleet_cuda_forward_compat",  # datacenter GPUs run a newer CUDA than the driver's (cuda-compat)
        "gpufleet_monitoring",  # the monitoring stage runs the monitoring role (off unless true)
        "gpufleet_fast_rerun",  # each role may skip its converge on a node still as it left it (default true)
        "gpufleet_grafana_password_file",
        "gpufleet_bundle_signers",  # preflight requires the lock signed by a key this file lists
        "gpufleet_services",  # the models served, each as replicas (fleet/services.py)
    }
)
# Roles that only other roles include, with explicit arguments (the relay: image_distribution and
# model_fetch). Their options are no inventory variables (validation refuses them) and the README's inventory
# reference leaves them out; each such role's README says so.
INTERNAL_ROLES = frozenset({"relay"})

# Total memory per GPU as CUDA reports it (torch.cuda.mem_get_info), which is what vLLM multiplies by
# gpu_memory_utilization. Measured: RTX 3090 (shared testdata), H100 80GB HBM3 (the GPU machine). The others
# are the boards' MiB figures from nvidia-smi less the same ~0.5 GiB reservation: set
# gpufleet_gpu_memory_gib to override.
GPU_MEMORY_GIB: dict[str, float] = {
    "NVIDIA GeForce RTX 3090": 23.69,
    "NVIDIA GeForce RTX 4090": 23.65,
    "NVIDIA H100 80GB HBM3": 79.18,
    "NVIDIA H800": 79.18,
    "NVIDIA A100-SXM4-80GB": 79.15,
    "NVIDIA A100-SXM4-40GB": 39.39,
    "NVIDIA L40S": 44.39,
    "NVIDIA A10": 22.05,
}


def gpu_memory_gib(gpus: GpuSpec) -> float | None:
    """The memory of one GPU: declared, else the catalog's figure for the declared model."""
    if gpus.memory_gib is not None:
        return gpus.memory_gib
    if gpus.model is None:
        return None
    return GPU_MEMORY_GIB.get(gpus.model)
