"""Schedule trials on Ray core tasks and collect their results.

Why Ray core and not Tune: a trial is a single function call with fixed config (no search
algorithm, no early stopping), retries on a dead worker are `max_retries`, and resume/dedupe
are keyed on MLflow trial ids, which outlive Tune's experiment folders. Each task runs in a
fresh worker process (`max_calls=1`): clean memory figures and no state shared between trials.
"""
from __future__ import annotations

import os
import socket
import sys
import time
from typing import Any, Callable

import ray
from ray.exceptions import RayError

from fp8lab_conf.contracts import METRIC_LOSS, METRIC_TOKENS_PER_S_WINDOW, TrialLaunch
from fp8lab_conf.garbage_collection import collection_paused, skip_final_collection
from orchestrator.errors import UserInputError

PIN_AMOUNT = 0.001  # a pin asks for a sliver of the node's custom resource: it places, never limits
_BUILTIN_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")


def init_ray(cluster: dict[str, Any]) -> None:
    """Start a local Ray or join `cluster.address`.

    A local Ray (2.59+) turns token authentication on by itself; we never switch it off, and
    say so loudly if the environment did. The dashboard is off by default and binds 127.0.0.1;
    every other port of a local Ray listens on 127.0.0.1 too (`_loopback_only`).
    """
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        print("fp8lab: warning: RAY_AUTH_MODE=disabled in your environment: Ray's token authentication is off",
              file=sys.stderr)
    common = dict(log_to_driver=False, configure_logging=False, ignore_reinit_error=True,
                  runtime_env=cluster.get("runtime_env") or None)
    if cluster["address"]:
        try:
            ray.init(address=cluster["address"], **common)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise UserInputError(f"cluster.address: cannot connect to Ray at {cluster['address']} ({_first_line(exc)}) "
                                 "(fix: check the address, or drop cluster.address to start a local Ray)") from None
        return
    _loopback_only()
    ray.init(num_cpus=cluster["num_cpus"], num_gpus=cluster["num_gpus"],
             include_dashboard=cluster["include_dashboard"], dashboard_host=cluster["dashboard_host"], **common)


LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def _loopback_only() -> None:
    """Make a local Ray listen on 127.0.0.1 only.

    By default Ray gives even a one-machine `ray.init()` the node's network address, and then its
    DashboardAgent serves Prometheus metrics (session name, task names, resources) on 0.0.0.0
    without authentication, and the GCS, raylet, object manager and workers listen on every
    interface. Ray's own switch for a loopback-only node is `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`
    (what it does on Windows and macOS): the node IP becomes 127.0.0.1 and every component binds
    it. Ray reads the variable once, at import, into `ray_constants.ENABLE_RAY_CLUSTER`, and the
    processes it spawns read it from their environment, so both are set. Only for a Ray this
    driver starts; a cluster joined with `cluster.address` is left as its operators set it up.
    """
    from ray._private import ray_constants  # noqa: PLC0415 - the constant Ray's env switch fills

    os.environ[LOOPBACK_ENV] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False


def check_address(cluster: dict[str, Any], timeout_s: float = 5.0) -> None:
    """Refuse an address nothing answers at, in seconds: `ray.init` itself retries a dead GCS
    address for minutes. `auto` (and no address) is left to Ray."""
    address = cluster["address"]
    if not address or address in ("auto", "local"):
        return
    scheme, _, target = address.rpartition("://")
    host, _, port = target.rstrip("/").rpartition(":")
    if not port.isdigit():
        if scheme != "ray":
            return  # not host:port: let Ray interpret it (and report it)
        host, port = target.rstrip("/"), "10001"  # Ray Client's default port
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise UserInputError(f"cluster.address: nothing answers at {address} ({reason}) (fix: start the cluster "
                             "(`ray start --head`) or correct the address; drop cluster.address to start a local Ray)") from None


def check_resources(cluster: dict[str, Any]) -> None:
    """A trial asking for more GPUs/CPUs than the cluster has would wait forever: refuse now."""
    total = ray.cluster_resources()
    if cluster["gpus_per_trial"] > total.get("GPU", 0):
        raise UserInputError(f"cluster.gpus_per_trial: {cluster['gpus_per_trial']} GPU(s) per trial requested but the "
                             f"Ray cluster has {total.get('GPU', 0):g} (fix: cluster.gpus_per_trial=0 to run on CPU)")
    shortage = cpu_shortage(cluster, total.get("CPU", 0), local=False)
    if shortage:
        raise UserInputError(shortage)
    wanted = {**{name: PIN_AMOUNT for name in cluster.get("pin_trials") or []}, **(cluster.get("trial_resources") or {})}
    short = [name for name, amount in wanted.items() if total.get(name, 0) < amount]
    if short:
        have = ", ".join(f"{k}={v:g}" for k, v in sorted(total.items()) if k not in _BUILTIN_RESOURCES) or "none"
        raise UserInputError(f"cluster.trial_resources/pin_trials: the Ray cluster has not enough of {', '.join(short)} "
                             f"(its custom resources: {have}) (fix: start nodes with ray start --resources='{{\"{short[0]}\": 1}}', "
                             "or drop the resource)")


def cpu_shortage(cluster: dict[str, Any], cpus: float, local: bool) -> str | None:
    """The CPU-per-trial rule, checked before a local Ray starts (against `cluster.num_cpus`) and once
    connected to a cluster (against what it reports): a trial asking for more CPUs than Ray has would
    wait forever."""
    if cluster["cpus_per_trial"] <= cpus:
        return None
    has, fix = ("the local Ray gets", ", or raise cluster.num_cpus") if local else ("the cluster has", "")
    return f"cluster.cpus_per_trial: {cluster['cpus_per_trial']} CPUs per trial but {has} {cpus:g} (fix: cluster.cpus_per_trial=1{fix})"


def check_local_resources(cluster: dict[str, Any]) -> None:
    """For a local Ray (no `cluster.address`), the checks of `check_resources` that can be made
    before Ray starts: a sweep that could never schedule fails in a second, and once these pass
    nothing about a local cluster can refuse the sweep after its MLflow store exists."""
    if cluster["address"]:
        return
    cpus = cluster["num_cpus"] if cluster["num_cpus"] is not None else (os.cpu_count() or 1)
    shortage = cpu_shortage(cluster, cpus, local=True)
    problems = [shortage] if shortage else []
    custom = [*(cluster.get("trial_resources") or {}), *(cluster.get("pin_trials") or [])]
    if custom:
        problems.append(f"cluster.trial_resources/pin_trials: {', '.join(custom)} only exist on a Ray cluster started with "
                        "--resources (fix: set cluster.address to that cluster, or drop the resource)")
    if problems:
        raise UserInputError(problems)


def node_count() -> int:
    return sum(1 for node in ray.nodes() if node.get("Alive"))


def parallel_slots(cluster: dict[str, Any]) -> int:
    """How many trials can run at once given the per-trial request."""
    total = ray.cluster_resources()
    slots = total.get("CPU", 1) // cluster["cpus_per_trial"]
    if cluster["gpus_per_trial"]:
        slots = min(slots, total.get("GPU", 0) // cluster["gpus_per_trial"])
    return max(1, int(slots))


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


@ray.remote(max_calls=1)
def run_trial_task(launch: TrialLaunch, board: Any) -> dict[str, Any]:
    """Runs in a Ray worker. Imports the training stack here, never in the driver."""
    started = time.time()
    with collection_paused():  # the training stack's imports: seconds of collections for nothing
        from workloads.entry import run  # noqa: PLC0415 - heavy import belongs to the worker

    board.update.remote(launch.trial_id, {"state": "RUNNING", "step": 0})

    def progress(step: int, metrics: dict[str, float]) -> None:
        fields = {"step": step, "loss": metrics.get(METRIC_LOSS), "tokens_per_s": metrics.get(METRIC_TOKENS_PER_S_WINDOW)}
        if metrics.get("health"):  # the health verdict's line, on the verdict step only (docs/health.md)
            fields["health"] = metrics["health"]
        board.update.remote(launch.trial_id, fields)

    result = run(launch, progress)
    result["task_wall_s"] = time.time() - started  # the slot was busy this long (imports included)
    result["gpu_ids"] = [str(g) for g in ray.get_gpu_ids()]
    result["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    board.update.remote(launch.trial_id, {"state": result["status"], "ended": time.time()})
    skip_final_collection()  # max_calls=1: the worker exits once Ray has the result
    return result


def trial_resources(cluster: dict[str, Any], index: int) -> dict[str, float]:
    """Custom resources for the index-th trial: cluster.trial_resources plus its round-robin pin."""
    resources = dict(cluster.get("trial_resources") or {})
    pins = cluster.get("pin_trials") or []
    if pins:
        name = pins[index % len(pins)]
        resources[name] = resources.get(name, 0) + PIN_AMOUNT
    return resources


def submit(launch: TrialLaunch, board: Any, cluster: dict[str, Any], max_retries: int, index: int = 0) -> ray.ObjectRef:
    return run_trial_task.options(
        num_cpus=cluster["cpus_per_trial"], num_gpus=cluster["gpus_per_trial"],
        resources=trial_resources(cluster, index) or None,
        max_retries=max_retries, retry_exceptions=False, name=f"trial:{launch.policy_label}",
    ).remote(launch, board)


def wait_all(refs: dict[ray.ObjectRef, str], on_tick: Callable[[], None],
             on_result: Callable[[str, dict[str, Any]], None], tick_s: float = 0.5,
             refill: Callable[[], list[ray.ObjectRef]] | None = None,
             waiting: Callable[[], bool] | None = None) -> None:
    """Wait for every trial; a task that failed outright (worker died past its retries) becomes a
    FAILED result instead of an exception, so one bad trial never stops the sweep. `refill`, every
    tick, submits trials into free slots (their refs land in `refs`) and returns the new refs;
    `waiting` says whether trials are still waiting for a claim another process holds."""
    pending = list(refs)
    while pending or (waiting is not None and waiting()):
        if pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=tick_s)
        else:
            ready = []
            time.sleep(tick_s)
        for ref in ready:
            trial_id = refs[ref]
            try:
                on_result(trial_id, ray.get(ref))
            except RayError as exc:
                on_result(trial_id, {"status": "FAILED", "reason": f"worker failed: {_first_line(exc)}", "metrics": {}})
        pending += refill() if refill else []
        on_tick()
