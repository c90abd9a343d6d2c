"""Exposure: what fp8lab opens and what it records.

- the Ray a sweep starts keeps token authentication on and its dashboard on 127.0.0.1
  (`fp8lab ui` binding 127.0.0.1 is tested in test_ui.py);
- secrets in the environment (*TOKEN*, *KEY*, *SECRET*, *PASSWORD*) never reach MLflow params,
  tags, metrics or artifacts, nor the report;
- trust_remote_code is off unless set explicitly;
- every port a local sweep opens listens on the loopback address.

The secrets and the ports test read one sweep (`exposed_sweep`).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from tests.integration.conftest import TINY, client_for, run_cli, seed_store

pytestmark = pytest.mark.integration

SECRETS = {
    "FP8LAB_TEST_API_TOKEN": "sekrit-token-4711",
    "HF_TOKEN": "hf_sekritHubToken4712",
    "MY_SERVICE_SECRET": "sekrit-secret-4713",
    "DB_PASSWORD": "sekrit-password-4714",
    "OPENAI_API_KEY": "sk-sekrit-key-4715",
    "MLFLOW_TRACKING_PASSWORD": "sekrit-mlflow-4716",
}
LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}

RAY_PROBE = r"""
import json, socket, time, urllib.error, urllib.request
import ray
from orchestrator import ray_runner
from orchestrator.config_loader import compose_config, to_container
from ray._private.authentication.authentication_utils import is_token_auth_enabled

cluster = to_container(compose_config(["cluster.include_dashboard=true", "cluster.num_cpus=1"]))["cluster"]
ray_runner.init_ray(cluster)  # exactly how `fp8lab sweep` starts its local Ray
try:
    info = ray._private.worker.global_worker.node.address_info
    host, port = info["webui_url"].rsplit(":", 1)
    anonymous, deadline = None, time.monotonic() + 120  # a loaded machine starts the dashboard's modules late
    while anonymous is None:
        try:
            urllib.request.urlopen(f"http://{info['webui_url']}/api/version", timeout=10)
            anonymous = 200
        except urllib.error.HTTPError as exc:
            anonymous = exc.code
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)
    try:
        socket.create_connection((info["node_ip_address"], int(port)), timeout=3).close()
        on_node_ip = True
    except OSError:
        on_node_ip = False
    print("PROBE " + json.dumps({"token_auth": is_token_auth_enabled(), "dashboard_host": host,
                                 "anonymous_api_status": anonymous, "dashboard_on_node_ip": on_node_ip,
                                 "node_ip": info["node_ip_address"], "gcs_address": info["gcs_address"]}))
finally:
    ray.shutdown()
"""


def test_local_ray_has_token_auth_and_a_localhost_dashboard(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}  # Ray's default, as a user gets it
    env["RAY_DASHBOARD_STARTUP_TIMEOUT_S"] = "300"  # Ray's 60 s is short for a CI machine running other tests
    proc = subprocess.run([sys.executable, "-c", RAY_PROBE], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=480)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("PROBE ")), None)
    assert proc.returncode == 0 and line, proc.stdout[-2000:] + proc.stderr[-3000:]
    probe = json.loads(line.removeprefix("PROBE "))
    assert probe["token_auth"] is True, probe
    assert probe["dashboard_host"] == "127.0.0.1", probe
    assert probe["anonymous_api_status"] in (401, 403), probe  # no token, no answer
    if probe["node_ip"] != "127.0.0.1":
        assert probe["dashboard_on_node_ip"] is False, probe


def test_defaults_do_not_expose(tmp_path: Path) -> None:
    from orchestrator.cli import build_parser
    from orchestrator.config_loader import compose_config, to_container

    config = to_container(compose_config([]))
    assert config["model"]["trust_remote_code"] is False
    assert config["cluster"]["include_dashboard"] is False and config["cluster"]["dashboard_host"] == "127.0.0.1"
    assert build_parser().parse_args(["ui"]).host == "127.0.0.1"
    printed = run_cli(["trial", "--cfg", "job"], tmp_path).stdout
    assert "trust_remote_code: false" in printed


def test_trust_remote_code_reaches_the_loader_only_as_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import AutoTokenizer

    from workloads.model import loading as model_loading

    seen: list[bool] = []

    class _Stop(Exception):
        pass

    def fake_from_pretrained(*args, **kwargs):
        seen.append(kwargs.get("trust_remote_code"))
        raise _Stop

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", fake_from_pretrained)
    for cfg, expected in (({"name_or_path": "x", "dtype": "float32"}, False),
                          ({"name_or_path": "x", "dtype": "float32", "trust_remote_code": False}, False),
                          ({"name_or_path": "x", "dtype": "float32", "trust_remote_code": True}, True)):
        with pytest.raises(_Stop):
            model_loading.load_base_model(cfg, Path("."), None)
        assert seen[-1] is expected


@pytest.fixture(scope="module")
def exposed_sweep(tmp_path_factory: pytest.TempPathFactory, store_template: Path) -> SimpleNamespace:
    """One real one-trial sweep (report included) with secrets in its environment, its process
    tree's listening sockets sampled until it ends: read by the secrets and the ports test."""
    workdir = seed_store(tmp_path_factory.mktemp("exposure"), store_template)
    logs = tmp_path_factory.mktemp("exposure-output")  # files, not pipes: nobody reads a pipe while it runs
    # the driver must set Ray's loopback switch itself, not inherit it
    env = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
    env.update(SECRETS, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    args = ["sweep", *TINY, "cluster.num_cpus=1", "sweep.name=t-exposure", "sweep.axes.precision=[bf16]", "sweep.axes.seed=[0]"]
    with (logs / "stdout").open("w") as out, (logs / "stderr").open("w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", *args], cwd=workdir, env=env,
                                stdout=out, stderr=err, text=True)
        root, seen, deadline = psutil.Process(proc.pid), set(), time.monotonic() + 600
        while proc.poll() is None and time.monotonic() < deadline:
            seen |= _listening(root)
            time.sleep(0.3)
        proc.wait(timeout=60)
    stdout, stderr = (logs / "stdout").read_text(), (logs / "stderr").read_text()
    assert proc.returncode == 0, stdout[-3000:] + stderr[-4000:]
    return SimpleNamespace(workdir=workdir, stdout=stdout, stderr=stderr, seen=seen)


def _listening(root: psutil.Process) -> set[tuple[str, str, int]]:
    found = set()
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return found
    for proc in procs:
        try:
            name = proc.name()
            found |= {(name, c.laddr.ip, c.laddr.port) for c in proc.net_connections(kind="inet")
                      if c.status == psutil.CONN_LISTEN}
        except psutil.Error:
            continue
    return found


def test_every_listening_port_of_a_local_sweep_is_on_loopback(exposed_sweep: SimpleNamespace) -> None:
    """Reliability round 3, case 11. Before, Ray's DashboardAgent served Prometheus metrics
    (session name, task names, resources) on 0.0.0.0 without authentication, and the GCS, raylet,
    object manager and workers listened on every interface, even though the sweep started Ray for
    this machine only. The sweep's whole process tree (driver, GCS, raylet, agents, workers) was
    sampled until it ended."""
    seen = exposed_sweep.seen
    names = {name for name, _, _ in seen}
    assert "gcs_server" in names and any("DashboardAgent" in n for n in names), (names, exposed_sweep.stdout[-2000:])
    exposed = sorted(s for s in seen if s[1] not in LOOPBACK)
    assert not exposed, f"listening beyond loopback: {exposed}"


def test_environment_secrets_never_reach_mlflow_or_the_report(exposed_sweep: SimpleNamespace) -> None:
    tmp_path = exposed_sweep.workdir
    proc = exposed_sweep
    client = client_for(tmp_path)
    experiment = client.get_experiment_by_name("t-exposure")
    runs = client.search_runs([experiment.experiment_id])
    assert {r.data.tags.get("fp8lab.role") for r in runs} == {"sweep", "trial"}
    trial = next(r for r in runs if r.data.tags.get("fp8lab.role") == "trial")
    assert trial.data.params["model.trust_remote_code"] == "False"

    recorded: list[tuple[str, str]] = [("experiment tags", json.dumps(experiment.tags))]
    for run in runs:
        data = run.data
        recorded += [(f"{run.info.run_name} params", json.dumps(data.params)),
                     (f"{run.info.run_name} tags", json.dumps(data.tags)),
                     (f"{run.info.run_name} metric names", json.dumps(sorted(data.metrics)))]
        local = Path(client.download_artifacts(run.info.run_id, "", str(tmp_path / "artifacts" / run.info.run_id)))
        files = [p for p in local.rglob("*") if p.is_file()]
        assert files, f"{run.info.run_name} has no artifacts"
        recorded += [(f"{run.info.run_name} artifact {p.relative_to(local)}", p.read_bytes().decode("utf-8", "replace"))
                     for p in files]
    report_files = [p for p in (tmp_path / "fp8lab-report").rglob("*") if p.is_file()]
    assert report_files, proc.stdout[-2000:]
    recorded += [(f"report {p.name}", p.read_bytes().decode("utf-8", "replace")) for p in report_files]
    recorded += [("CLI output", proc.stdout + proc.stderr)]

    places = {where for where, _ in recorded}
    for expected in ("config/resolved.yaml", "logs/trial.log", "result.json", "sweep/config.yaml", "report report.md"):
        assert any(expected in where for where in places), (expected, sorted(places))  # the search covers them
    leaks = [(where, name) for where, text in recorded for name, value in SECRETS.items() if value in text]
    assert not leaks, leaks
    # the names are not recorded either (an env dump would show them even with values masked)
    named = [(where, name) for where, text in recorded for name in SECRETS if name in text]
    assert not named, named
