"""Where one training step's time goes: torch.profiler over a few steps of one in-process trial.

    python benchmarks/profile_step.py --policy fp8_naive --hidden 1024     # ~1 min
    python benchmarks/profile_step.py --policy fp8_protected --telemetry-every 1

Builds the trial like the other benchmarks (``_common.build_trial``), warms it up, then profiles
``--steps`` steps and prints the top operators by self CPU time (torch on one thread). A tool for
finding hot spots, not a benchmark: it writes no JSON.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="fp8_naive")
    parser.add_argument("--hidden", type=int, default=None, help="wide model (default: embedded)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--telemetry-every", type=int, default=None, help="record every k steps (default off)")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--sort", default="self_cpu_time_total")
    args = parser.parse_args(argv)
    common.pin_threads(1)
    import torch

    trial = common.build_trial(args.policy, hidden=args.hidden, layers=args.layers if args.hidden else None,
                               telemetry=args.telemetry_every is not None, telemetry_every=args.telemetry_every)
    trial.run_chunk(2)  # warm-up (compiled casts, allocations)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        per_step = trial.run_chunk(args.steps)
    print(f"{args.policy} hidden={args.hidden or 128}: {per_step['wall'] * 1e3:.1f} ms/step wall "
          f"(under the profiler)")
    print(prof.key_averages().table(sort_by=args.sort, row_limit=args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
