"""Known values of the synthetic sweeps used by the analysis tests (a uniquely named module, so
`from _report_data import ...` cannot pick up another package's conftest)."""

from __future__ import annotations

from tests.support.synthetic import SynthTrial

GIB = float(1 << 30)

# sweep "sw-main" (the latest sweep of the store): accuracy fractions, tokens/s and peak GiB per seed.
MAIN = {
    "bf16": dict(acc=[0.80, 0.82, 0.84], tps=[1000.0, 1010.0, 990.0], mem=[4.0, 4.0, 4.1]),
    "fp8_naive": dict(acc=[0.60, 0.66, 0.63], tps=[1500.0, 1550.0, 1450.0], mem=[2.4, 2.5, 2.5]),
    "fp8_protected": dict(acc=[0.79, 0.81, 0.83], tps=[1400.0, 1420.0, 1380.0], mem=[2.8, 2.8, 2.9]),
    "fp8_protected-no_scaler": dict(acc=[0.70, 0.72, 0.74], tps=[1400.0, 1410.0, 1390.0], mem=[2.8, 2.8, 2.8]),
    "fp8_protected-no_block_scales": dict(acc=[0.76, 0.78, 0.80], tps=[1450.0, 1460.0, 1440.0], mem=[2.7, 2.7, 2.7]),
}
ABLATION = {"fp8_protected-no_scaler": "scaler", "fp8_protected-no_block_scales": "block_scales"}
# a DIVERGED naive seed counts (its accuracy is part of what the policy delivers)
NAIVE_DIVERGED = dict(acc=0.30, tps=1500.0, mem=2.5, step=7, reason="loss became NaN at step 7")
PARAMS = {"data.train_size": 2000, "train.max_seq_len": 128}


def main_trials() -> list[SynthTrial]:
    out: list[SynthTrial] = []
    for policy, v in MAIN.items():
        for seed, (a, t, m) in enumerate(zip(v["acc"], v["tps"], v["mem"], strict=True)):
            out.append(
                SynthTrial(
                    policy,
                    seed,
                    accuracy=a,
                    tokens_per_s=t,
                    peak_bytes=m * GIB,
                    ablation=ABLATION.get(policy, ""),
                    underflow_events=5.0 if "naive" in policy else 1.0,
                )
            )
    d = NAIVE_DIVERGED
    out.append(
        SynthTrial(
            "fp8_naive",
            3,
            accuracy=d["acc"],
            tokens_per_s=d["tps"],
            peak_bytes=d["mem"] * GIB,
            status="DIVERGED",
            diverged_step=d["step"],
            reason=d["reason"],
            underflow_events=50.0,
        )
    )
    out.append(
        SynthTrial(
            "fp8_naive",
            4,
            accuracy=None,
            tokens_per_s=None,
            peak_bytes=None,
            final_loss=None,
            underflow_events=None,
            status="FAILED",
            reason="CUDA out of memory",
        )
    )
    out.append(SynthTrial("fp8_protected", 3, accuracy=None, mlflow_status="KILLED"))
    # retries: bf16 seed 0 was retried after a FINISHED run -> a later FAILED one must not win;
    # bf16 seed 1 has two FINISHED runs -> the latest (0.82, listed above with offset 0) wins over 0.50.
    out.append(
        SynthTrial("bf16", 0, accuracy=None, tokens_per_s=None, status="FAILED", reason="preempted", start_offset_s=300)
    )
    out.append(SynthTrial("bf16", 1, accuracy=0.50, tokens_per_s=10.0, peak_bytes=9 * GIB, start_offset_s=-300))
    return out


def axes_trials() -> list[SynthTrial]:
    """Sweep over lora.r: r=8 has 2 seeds each; r=16 has one fp8_protected seed (n=1) and equal bf16 seeds."""
    out = []
    for seed, (a, b) in enumerate([(0.70, 0.68), (0.72, 0.66)]):
        out.append(SynthTrial("bf16", seed, accuracy=a, tokens_per_s=100.0 + seed, axes={"lora.r": "8"}))
        out.append(SynthTrial("fp8_protected", seed, accuracy=b, tokens_per_s=150.0 + seed, axes={"lora.r": "8"}))
        out.append(SynthTrial("bf16", seed, accuracy=0.75, tokens_per_s=100.0, axes={"lora.r": "16"}))
    out.append(SynthTrial("fp8_protected", 0, accuracy=0.74, tokens_per_s=140.0, axes={"lora.r": "16"}))
    return out
