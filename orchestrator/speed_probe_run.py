"""`sweep.speed_probe=true`: the paired speed probe (workloads/bench.py), once per sweep, in a
Ray worker with one trial's resources, logged to the sweep's parent run for the report.

Logged: `speed_probe/<policy>/ratio`, `.../low`, `.../high` (wall-clock step-time ratio to bf16,
median of per-round ratios and its CI), `speed_probe/rounds`, `speed_probe/loadavg_start|end`,
and the whole result as `speed_probe.json`.
"""
from __future__ import annotations

from typing import Any

import ray

from fp8lab_conf.garbage_collection import collection_paused, skip_final_collection

PREFIX = "speed_probe/"


@ray.remote(max_calls=1)
def probe_task(configs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    with collection_paused():  # the training stack's imports
        from workloads.bench import ProbeSettings, run_probe  # noqa: PLC0415 - the training stack, in the worker

    result = run_probe(configs, ProbeSettings())
    skip_final_collection()  # max_calls=1: the worker exits once Ray has the result
    return result


def run_and_log(client: Any, parent_run_id: str, config: dict[str, Any], overrides: list[str]) -> str:
    """Run the probe on the cluster, log it to the parent run, return one line for the console."""
    from orchestrator.bench_cmd import format_probe, probe_configs, probe_policies

    cluster = config["cluster"]
    task = probe_task.options(num_cpus=cluster["cpus_per_trial"], num_gpus=cluster["gpus_per_trial"], name="speed_probe")
    result = ray.get(task.remote(probe_configs(probe_policies(config), overrides)))
    client.log_dict(parent_run_id, result, "speed_probe.json")
    for key, value in probe_metrics(result).items():
        client.log_metric(parent_run_id, key, value)
    return format_probe(result)


def probe_metrics(result: dict[str, Any]) -> dict[str, float]:
    out = {f"{PREFIX}rounds": float(result["rounds"]), f"{PREFIX}loadavg_start": float(result["loadavg_start"]),
           f"{PREFIX}loadavg_end": float(result["loadavg_end"])}
    for policy, clocks in result["policies"].items():
        ratio = clocks["wall"]["ratio"]
        out.update({f"{PREFIX}{policy}/ratio": ratio["median"], f"{PREFIX}{policy}/low": ratio["low"],
                    f"{PREFIX}{policy}/high": ratio["high"]})
    return out
