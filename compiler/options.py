"""Typed options: what a compile may vary (part of the key) and the wire-format limits."""

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator


class CompileOptions(BaseModel):
    """Knobs of one compile. Every field is part of the key, defaults included (`released_inputs` only
    when set)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fusion: bool = Field(True, description="fuse nodes into shared kernels (the scheduler)")
    max_fusion_size: int = Field(64, ge=1, le=1024, description="most IR nodes in one kernel")
    autotune: bool = Field(True, description="time kernel configs on a GPU worker")
    benchmark_fusion: bool = Field(True, description="time fused against unfused kernels where the heuristic is unsure")
    eager_random: bool = Field(False, description="random ops (dropout, rand, bernoulli) run as ATen calls and "
                               "draw eager's numbers under the same seed; off, they are drawn inside the fused "
                               "kernels (Philox, seeded from torch's generator): fewer launches, other masks")
    released_inputs: tuple[Annotated[int, Field(ge=0)], ...] = Field(
        (), max_length=100_000,
        description="positions of the graph inputs the caller drops after their last read (a backward's saved "
                    "activations): the step order counts their memory until then. Part of the key only when set")
    autotune_budget_s: float = Field(30.0, ge=0, le=600,
                                     description="seconds of GPU timing per graph, benchmark-driven fusion and autotuning "
                                                 "together; fusion takes at most half")

    @field_validator("released_inputs")
    @classmethod
    def _sorted_unique(cls, positions: tuple[int, ...]) -> tuple[int, ...]:
        """One spelling per set of positions: the key does not depend on their order."""
        return tuple(sorted(set(positions)))


class Limits(BaseModel):
    """Bounds on a submitted graph; over any of them is a validation error, not a crash."""

    model_config = ConfigDict(frozen=True)

    max_json_bytes: int = 16 * 1024 * 1024
    max_nodes: int = 100_000  # whole-model graphs (a 32-layer LLaMA forward and backward) have 15-30k nodes
    max_rank: int = 8
    max_numel: int = 2**36
    max_name_length: int = 200
    max_list_length: int = 4096
    max_constants: int = 1024
    max_constant_bytes: int = 4 * 1024 * 1024  # raw bytes of one constant (base64 adds a third)
    max_constants_bytes: int = 8 * 1024 * 1024  # all constants of one graph together
