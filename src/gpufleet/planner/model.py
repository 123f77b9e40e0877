"""The planner's data: its request, its answer per GPU and per stage, and the resolved context.

Kept apart from :mod:`gpufleet.planner.core` so that the checks and the core both build on it without
importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gpufleet.planner.arch import DTYPE_BYTES, DerivedMaxLen, ModelArch, Quantization
from gpufleet.planner.vllm_archs import VLLM_VERSION

# vLLM's --block-size choices (CacheConfig); plan --block-size and the inventory's schema take the same ones.
BLOCK_SIZES = (1, 8, 16, 32, 64, 128)


class GpuDevice(BaseModel):
    """One GPU: its name and total memory as CUDA reports it (``torch.cuda.mem_get_info`` total)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    memory_gib: float = Field(gt=0)


class PlanRequest(BaseModel):
    """A model, the GPUs of a deployment and vLLM's settings (vLLM's names and defaults)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    hf_config: dict[str, Any]
    gpus: tuple[GpuDevice, ...] = Field(min_length=1)
    tensor_parallel_size: int = Field(default=1, ge=1)
    pipeline_parallel_size: int = Field(default=1, ge=1)
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    max_model_len: int | None = Field(default=None, ge=1)  # None = the derived maximum
    block_size: int = Field(default=16, ge=1)
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    quantization: str | None = None
    cpu_offload_gb: float = Field(default=0.0, ge=0)  # GiB per GPU, as vLLM reads it
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    max_num_seqs: int | None = Field(default=None, ge=1)
    kv_cache_memory_gib: float | None = Field(default=None, gt=0)
    enforce_eager: bool = False
    enable_expert_parallel: bool = False
    # --limit-mm-per-prompt: items per prompt by modality ({"image": 0, "video": 0}); None or a modality left
    # out = vLLM's default (999). Every modality of a multimodal model at 0: vLLM loads the language model
    # alone.
    limit_mm_per_prompt: dict[str, int] | None = None


class StagePlan(BaseModel):
    """One GPU of one pipeline stage (all TP ranks of a stage hold the same amounts)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pipeline_rank: int
    first_layer: int
    end_layer: int  # exclusive, as vLLM's get_pp_indices
    embedding_gib: float
    decoder_layers_gib: float
    lm_head_gib: float
    other_gib: float  # final norm and rotary cache
    weights_gib: float
    vision_tower_gib: float = 0.0  # a multimodal model's vision tower and projector (in weights_gib)
    offloaded_weights_gib: float
    activation_peak_gib: float
    non_torch_gib: float
    cuda_graph_gib: float
    kv_bytes_per_token: int
    kv_cache_gib: float
    kv_cache_blocks: int


class Plan(BaseModel):
    """What vLLM will do per GPU; figures named in ``estimated`` are estimates, the rest are computed."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    vllm_version: str = VLLM_VERSION  # the vLLM release whose logic (and start-ups) the plan follows

    model_type: str
    dtype: str
    kv_cache_dtype: str
    quantization: str | None
    gpu_name: str  # the GPU that decides (the smallest)
    gpu_memory_gib: float
    tensor_parallel_size: int
    pipeline_parallel_size: int
    gpu_memory_utilization: float
    requested_gib_per_gpu: float
    max_model_len: int
    derived_max_model_len: int
    max_num_batched_tokens: int
    max_num_seqs: int
    block_size: int  # as vLLM settles it: a hybrid model's attention block holds a Mamba state
    weights_gib_per_gpu: float
    vision_tower_gib_per_gpu: float  # included in weights_gib_per_gpu; 0 when vLLM does not build the tower
    offloaded_weights_gib_per_gpu: float
    activation_peak_gib: float
    non_torch_gib: float
    cuda_graph_gib: float
    kv_bytes_per_token_per_gpu: int
    kv_cache_gib_per_gpu: float
    kv_cache_blocks: int
    kv_cache_tokens: int
    max_concurrency: float
    model_runner: str  # "v1" or "v2": vLLM 0.24's model runner for this architecture
    kv_cache_groups: int  # vLLM's KV-cache groups (more than one with sliding-window or Mamba layers)
    estimated: list[str]
    deciding_stage: int
    stages: list[StagePlan]
    errors: list[str]
    warnings: list[str]
    # When the KV cache does not fit: settings that would, each changed alone (vLLM's option names with
    # underscores): max_model_len, gpu_memory_utilization, tensor_parallel_size, pipeline_parallel_size.
    proposals: dict[str, float | int] = Field(default_factory=dict)

    def to_json_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


@dataclass(frozen=True)
class KvCapacity:
    blocks: int
    tokens: int
    max_concurrency: float


def kv_cache_capacity(
    kv_cache_bytes: int, bytes_per_token: int, block_size: int, max_model_len: int
) -> KvCapacity:
    """Blocks, tokens and "Maximum concurrency for N tokens per request" for a KV-cache size."""
    blocks = max(0, kv_cache_bytes // (block_size * bytes_per_token)) if bytes_per_token else 0
    tokens = blocks * block_size
    return KvCapacity(blocks, tokens, tokens / max_model_len)


@dataclass(frozen=True)
class PlanContext:
    """The request resolved: model shape, dtypes, quantization, the deciding GPU and batch sizes."""

    request: PlanRequest
    arch: ModelArch
    dtype: str
    kv_cache_dtype: str
    kv_dtype_bytes: int
    quant: Quantization | None
    derived: DerivedMaxLen
    gpu: GpuDevice
    batching: tuple[int, int]
    config_quantization: str | None = None

    @property
    def max_model_len(self) -> int:
        return self.request.max_model_len or self.derived.value

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def world_size(self) -> int:
        return self.request.tensor_parallel_size * self.request.pipeline_parallel_size
