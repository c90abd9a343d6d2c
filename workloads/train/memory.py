"""Peak memory of a trial: CUDA allocator peak on GPU, peak RSS growth on CPU.

On CPU there is no allocator counter, so we report how far the process's peak resident set
grew above what it held before the model was loaded (libraries excluded). Ray runs each trial
in a fresh worker process (max_calls=1), so the peak belongs to this trial alone.
"""
from __future__ import annotations

import resource
import sys

import psutil
import torch


class PeakMemory:
    def __init__(self, device: torch.device):
        self.device = device
        self.baseline = psutil.Process().memory_info().rss
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    def peak_bytes(self) -> int:
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        peak_bytes = peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB
        return max(0, int(peak_bytes - self.baseline))
