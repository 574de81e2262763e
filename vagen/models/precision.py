"""Whether a device computes bfloat16 natively, and the warning for bf16 where it does not.

bf16 autocast is a speed-up on GPUs and on CPUs with AVX512-BF16 (AMX CPUs have it too), and a large slow-down on
other CPUs, which emulate bf16 matmuls: one SFT step of 16 tiny_vl dialogues took 85 s under bf16 autocast against
4.9 s in float32 on a 2-core AMD EPYC with AVX2 only (17x; README, Supervised warm starts). PyTorch says as much in
its AMP notes ("CPU Op-Specific Behavior"). The check is the one vLLM makes.
"""

from __future__ import annotations

import torch


def native_bf16(device: str | torch.device) -> bool:
    """True where bf16 matmuls run in hardware: a CUDA GPU that supports bf16, a CPU with AVX512-BF16 (and a torch
    build with oneDNN, whose kernels use it). Other device types are assumed to (nothing measured says otherwise)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return bool(torch.cpu._is_avx512_bf16_supported()) and torch.backends.mkldnn.is_available()
    return True


def emulated_bf16_warning(option: str, device: str | torch.device) -> str | None:
    """The warning for `option`=true on a device without native bf16 (None where bf16 is native)."""
    if native_bf16(device):
        return None
    return (
        f"{option}=true on a CPU without native bf16 (no AVX512-BF16 or AMX): autocast emulates it, which was 17x "
        "slower than float32 for a tiny_vl SFT step on a 2-core AVX2 CPU. Set "
        f"{option}=false to compute in float32 (the same training up to rounding)."
    )
