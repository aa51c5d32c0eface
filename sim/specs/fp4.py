"""FP4 weight formats: 4-bit E2M1 values in blocks, each block with its own scale, whose bytes
a weight read and the memory budget count.

- ``nvfp4`` (NVIDIA's, Blackwell): one FP8 E4M3 scale per 16 values, plus one FP32 scale per
  tensor (negligible, not counted): ``0.5 + 1 / 16 = 0.5625`` bytes per weight (NVIDIA
  Technical Blog, "Introducing NVFP4 for Efficient and Accurate Low-Precision Inference",
  2025-06-24, https://developer.nvidia.com/blog/introducing-nvfp4-for-efficient-and-accurate-
  low-precision-inference/, read 2026-12-02);
- ``mxfp4`` (the OCP Microscaling format; gpt-oss's MoE weights): one E8M0 (8-bit power of
  two) scale per 32 values: ``0.5 + 1 / 32 = 0.53125`` bytes per weight (OCP Microscaling
  Formats (MX) Specification v1.0, 2023-09, Table 1, MXFP4: block size 32, scale E8M0);
- ``fp4``: NVFP4 (the format Blackwell's FP4 tensor-core peaks are quoted for).

Compute (:func:`sim.costs.roofline_params.compute_peak`): every FP4 format runs FP4 GEMMs at
the FP4 peak on a GPU with FP4 tensor cores (Blackwell's block-scaled MMA takes both scale
kinds), else weight-only: the 4-bit values and their scales read, dequantised in the kernel,
computed at the GPU's 16-bit peak (vLLM's MXFP4 gpt-oss on Hopper: BF16 activations); FP4
activations there are an error.
"""

from __future__ import annotations

# format -> (values per scale, bytes per scale)
FP4_SCALES = {"nvfp4": (16, 1), "mxfp4": (32, 1), "fp4": (16, 1)}
FP4_DTYPES = tuple(FP4_SCALES)


def fp4_bytes(name: str) -> float:
    """Bytes per weight of the FP4 format ``name``: half a byte plus its share of a scale."""
    block, scale = FP4_SCALES[name]
    return 0.5 + scale / block
