"""What one call costs on a GPU, measured two ways: the CPU time to issue its work, and its
kernels under torch.profiler. Shared by bench/models.py and bench/host_overhead.py."""

from __future__ import annotations

import time

import torch


def host_time_ms(fn) -> float:
    """CPU time to issue `fn`'s work: the GPU is idle at the start, so the queue never fills."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    issued = time.perf_counter() - start
    torch.cuda.synchronize()
    return issued * 1e3


def profile_kernels(fn, top: int = 8) -> dict:
    """One call of `fn` under torch.profiler: kernel count, summed GPU time, the top kernels."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by_name: dict[str, list[float]] = {}
    for event in kernels:
        by_name.setdefault(event.name, []).append(event.device_time_total / 1e3)
    ranked = sorted(by_name.items(), key=lambda item: -sum(item[1]))[:top]
    return {"kernels": len(kernels), "gpu_ms": sum(e.device_time_total for e in kernels) / 1e3,
            "top_kernels": [[name[:120], round(sum(ms), 3), len(ms)] for name, ms in ranked]}
