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


def kernel_times_us(fn) -> dict[str, list[float]]:
    """Each GPU kernel's durations (us) during one call of `fn` under torch.profiler, by name."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    by_name: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            by_name.setdefault(event.name, []).append(event.device_time_total)
    return by_name


def profile_kernels(fn, top: int = 8) -> dict:
    """One call of `fn` under torch.profiler: kernel count, summed GPU time, the top kernels."""
    by_name = {name: [us / 1e3 for us in times] for name, times in kernel_times_us(fn).items()}
    ranked = sorted(by_name.items(), key=lambda item: -sum(item[1]))[:top]
    return {"kernels": sum(len(ms) for ms in by_name.values()), "gpu_ms": sum(sum(ms) for ms in by_name.values()),
            "top_kernels": [[name[:120], round(sum(ms), 3), len(ms)] for name, ms in ranked]}
