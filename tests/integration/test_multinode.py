"""A real multi-node sweep on this machine: PostgreSQL -> MLflow server -> two-node Ray -> Ray Jobs.

What runs (all on 127.0.0.1, unique ports, unique folders, each started by this test):
  * PostgreSQL from Debian's package (initdb in a temp folder, password auth on TCP),
  * `mlflow server` backed by it, started by infra/mlflow/entrypoint.sh (basic auth, proxied
    artifact serving into a local folder that stands in for the S3 bucket),
  * a two-node Ray cluster: `ray start --head` (custom resource node_a) and a second
    `ray start --address=...` (node_b) with its own temp folder, so each node unpacks the job's
    working directory on its own "disk" -- nothing reaches node_b through a shared path,
  * Ray token authentication on every node (RAY_AUTH_MODE=token + RAY_AUTH_TOKEN),
  * `ray job submit --working-dir PROJECT -- fp8lab sweep ...` with trials pinned to both nodes.

Then it checks that every trial's run, metrics and artifacts are in the server (and in its
artifact store, not on a node), that the report regenerates from the server, that a SQLite store
is refused on this cluster, and that every process it started is gone afterwards -- also when the
test fails (teardown runs in `finally`).

Skipped, with the reason, when PostgreSQL's server binaries or the psycopg driver are missing;
with FP8LAB_REQUIRE_MULTINODE=1 (set by .ci/run) a missing prerequisite fails instead.
Processes are stopped by the ids this test recorded, never by name.
"""
from __future__ import annotations

import contextlib
import glob
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from fp8lab_conf.filesystem import process_exists

pytestmark = [pytest.mark.integration, pytest.mark.multinode]

REPO = Path(__file__).resolve().parents[2]
EMBEDDED_TASK = REPO / "workloads" / "embedded" / "assets" / "task"
START_TIMEOUT_S = 180
JOB_TIMEOUT_S = 900
PIN = ["node_a", "node_b"]
POLICIES = ["bf16", "fp8_protected"]  # trial 0 -> node_a, trial 1 -> node_b (cluster.pin_trials)
TRIAL_ARTIFACTS = {"config/resolved.yaml", "precision/plan.json", "telemetry/telemetry.parquet", "logs/trial.log", "result.json"}


def run_fp8lab(args: list[str], cwd: Path, env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600, stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise AssertionError(f"fp8lab {' '.join(args)} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def _unavailable(reason: str) -> None:
    if os.environ.get("FP8LAB_REQUIRE_MULTINODE") == "1":
        pytest.fail(f"FP8LAB_REQUIRE_MULTINODE=1 but {reason}")
    pytest.skip(reason)


def postgres_bindir() -> Path | None:
    """Debian keeps initdb/pg_ctl/postgres in /usr/lib/postgresql/<major>/bin (not on PATH)."""
    candidates = [os.environ.get("FP8LAB_PG_BINDIR", "")]
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(str(Path(on_path).resolve().parent))
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(re.sub(r"\D", "", p) or 0), reverse=True)
    for folder in filter(None, candidates):
        if all((Path(folder) / tool).is_file() for tool in ("initdb", "pg_ctl", "postgres", "psql")):
            return Path(folder)
    return None


def free_ports(n: int) -> list[int]:
    """n distinct free ports on 127.0.0.1 (held together so none repeats)."""
    socks = []
    try:
        for _ in range(n):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        return [s.getsockname()[1] for s in socks]
    finally:
        for sock in socks:
            sock.close()


def _tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


@dataclass
class Started:
    """A process group this test started (start_new_session: group id == pid)."""

    name: str
    proc: subprocess.Popen
    log: Path

    @property
    def pgid(self) -> int:
        return self.proc.pid


@dataclass
class LocalStack:
    """PostgreSQL + MLflow server + two Ray nodes, all owned and stopped by this test."""

    root: Path
    env: dict[str, str]
    token: str = field(default_factory=lambda: secrets.token_hex(32))
    groups: list[Started] = field(default_factory=list)
    pg_data: Path | None = None
    pg_root: Path | None = None
    pg_bindir: Path | None = None
    pg_user: dict[str, Any] = field(default_factory=dict)
    postmaster_pid: int | None = None
    timings: dict[str, float] = field(default_factory=dict)
    strays: list[str] = field(default_factory=list)

    # ---- start ------------------------------------------------------------------------------
    def start(self, pg_bindir: Path) -> None:
        ports = free_ports(18)
        self.pg_port, self.mlflow_port, self.gcs_port, self.dashboard_port = ports[:4]
        self._head_ports, self._worker_ports = ports[4:11], ports[11:17]
        t0 = time.monotonic()
        self._start_postgres(pg_bindir)
        self.timings["postgres_s"] = time.monotonic() - t0
        t1 = time.monotonic()
        mlflow = self._spawn_mlflow()
        head = self._spawn_ray_head()
        self._wait_http(f"{self.tracking_uri}/health", mlflow, auth=False)
        self._wait_log(head, "block forever")
        worker = self._spawn_ray_worker()
        self._wait_log(worker, "block forever")
        self._wait_nodes(2)
        self.timings["mlflow_and_ray_s"] = time.monotonic() - t1

    @property
    def tracking_uri(self) -> str:
        return f"http://127.0.0.1:{self.mlflow_port}"

    @property
    def dashboard(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def _start_postgres(self, bindir: Path) -> None:
        self.pg_bindir = bindir
        # Its own folder outside pytest's (which is private to this user): the postgres account must reach it.
        pg_root = self.pg_root = Path(os.path.realpath(tempfile.mkdtemp(prefix="fp8lab-pg-")))
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root: use Debian's `postgres` account
            try:
                account = pwd.getpwnam("postgres")
            except KeyError:
                _unavailable("running as root and there is no 'postgres' user to run PostgreSQL as")
            os.chown(pg_root, account.pw_uid, account.pw_gid)
            self.pg_user = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}
        self.pg_password = secrets.token_hex(12)
        pwfile = pg_root / "pw"
        pwfile.write_text(self.pg_password + "\n")
        if self.pg_user:
            os.chown(pwfile, self.pg_user["user"], self.pg_user["group"])
        self.pg_data = pg_root / "data"
        self._pg([str(bindir / "initdb"), "-D", str(self.pg_data), "-U", "mlflow", f"--pwfile={pwfile}", "-E", "UTF8",
                  "--auth-local=trust", "--auth-host=scram-sha-256", "--no-sync"], cwd=pg_root)
        self._pg([str(bindir / "pg_ctl"), "-D", str(self.pg_data), "-l", str(pg_root / "postgres.log"), "-w", "-t", "60",
                  "-o", f"-c listen_addresses=127.0.0.1 -p {self.pg_port} -k {pg_root} -c fsync=off", "start"], cwd=pg_root)
        self.postmaster_pid = int((self.pg_data / "postmaster.pid").read_text().split()[0])
        for database in ("mlflow", "mlflow_auth"):  # tracking data; MLflow's basic-auth users and permissions
            self._pg([str(bindir / "psql"), "-h", str(pg_root), "-p", str(self.pg_port), "-U", "mlflow", "-d", "postgres",
                      "-c", f"CREATE DATABASE {database}"], cwd=pg_root)
        self.backend_uri = f"postgresql+psycopg://mlflow:{self.pg_password}@127.0.0.1:{self.pg_port}/mlflow"

    def _pg(self, command: list[str], cwd: Path) -> None:
        proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120, **self.pg_user)
        if proc.returncode != 0:
            raise AssertionError(f"{' '.join(command[:2])} failed ({proc.returncode}): {proc.stderr[-2000:]}")

    def _spawn(self, name: str, command: list[str], env: dict[str, str] | None = None) -> Started:
        log = self.root / f"{name}.log"
        handle = log.open("wb")
        proc = subprocess.Popen(command, cwd=self.root, env=env or self.env, stdout=handle, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        handle.close()
        started = Started(name, proc, log)
        self.groups.append(started)
        return started

    def _spawn_mlflow(self) -> Started:
        """The tracking server exactly as infra/mlflow starts it (its entrypoint script): PostgreSQL
        store, basic auth, proxied artifacts -- here into a local folder standing in for the bucket."""
        self.artifacts_dir = self.root / "artifact-store"
        self.artifacts_dir.mkdir()
        self.mlflow_user, self.mlflow_password = "admin", secrets.token_hex(16)
        env = {**self.env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{self.env.get('PATH', '')}",
               "MLFLOW_BACKEND_STORE_URI": self.backend_uri,
               "MLFLOW_AUTH_DATABASE_URI": self.backend_uri.rsplit("/", 1)[0] + "/mlflow_auth",
               "MLFLOW_AUTH_ADMIN_PASSWORD": self.mlflow_password,
               "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(32),
               "MLFLOW_AUTH_CONFIG_DIR": str(self.root), "MLFLOW_ARTIFACTS_DESTINATION": str(self.artifacts_dir),
               "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_DISABLE_TELEMETRY": "true"}
        return self._spawn("mlflow", ["sh", str(REPO / "infra" / "mlflow" / "entrypoint.sh"),
                                      "--host", "127.0.0.1", "--port", str(self.mlflow_port), "--workers", "1"], env)

    @property
    def mlflow_credentials(self) -> dict[str, str]:
        return {"MLFLOW_TRACKING_USERNAME": self.mlflow_user, "MLFLOW_TRACKING_PASSWORD": self.mlflow_password}

    def _ray(self) -> str:
        beside = Path(sys.executable).with_name("ray")
        return str(beside) if beside.exists() else (shutil.which("ray") or "ray")

    def _node_flags(self, ports: list[int]) -> list[str]:
        agent, grpc, metrics, runtime_env, node_manager, object_manager = ports[:6]
        return ["--node-ip-address=127.0.0.1", "--num-gpus=0", "--object-store-memory=100000000",
                f"--dashboard-agent-listen-port={agent}", f"--dashboard-agent-grpc-port={grpc}",
                f"--metrics-export-port={metrics}", f"--runtime-env-agent-port={runtime_env}",
                f"--node-manager-port={node_manager}", f"--object-manager-port={object_manager}",
                "--min-worker-port=0", "--max-worker-port=0", "--disable-usage-stats", "--block"]

    def _spawn_ray_head(self) -> Started:
        self.head_tmp = Path(os.path.realpath(self.root / "rayA"))  # short: Ray's socket paths have a length limit
        self.head_tmp.mkdir()
        return self._spawn("ray-head", [self._ray(), "start", "--head", f"--port={self.gcs_port}",
                                        f"--temp-dir={self.head_tmp}", "--num-cpus=2", '--resources={"node_a": 1}',
                                        "--include-dashboard=true", "--dashboard-host=127.0.0.1",
                                        f"--dashboard-port={self.dashboard_port}",
                                        f"--ray-client-server-port={self._head_ports[6]}", *self._node_flags(self._head_ports)])

    def _spawn_ray_worker(self) -> Started:
        self.worker_tmp = Path(os.path.realpath(self.root / "rayB"))  # its own "disk": own runtime_resources
        self.worker_tmp.mkdir()
        return self._spawn("ray-worker", [self._ray(), "start", f"--address=127.0.0.1:{self.gcs_port}",
                                          f"--temp-dir={self.worker_tmp}", "--num-cpus=1", '--resources={"node_b": 1}',
                                          *self._node_flags(self._worker_ports)])

    def _wait_log(self, started: Started, marker: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while marker not in _tail(started.log, 100_000):
            if started.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{started.name} did not start (exit {started.proc.poll()}):\n{_tail(started.log)}")
            time.sleep(0.5)

    def _wait_http(self, url: str, started: Started, auth: bool = True) -> bytes:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                return self.get(url, auth=auth)
            except (urllib.error.URLError, ConnectionError, OSError):
                if started.proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"{started.name} is not answering {url} (exit {started.proc.poll()}):\n"
                                         f"{_tail(started.log)}") from None
                time.sleep(0.5)

    def get(self, url: str, auth: bool = True) -> bytes:
        headers = {"Authorization": f"Bearer {self.token}"} if auth else {}
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as response:
            return response.read()

    def nodes(self) -> list[dict[str, Any]]:
        """Ray's state API through the dashboard (token required)."""
        data = json.loads(self.get(f"{self.dashboard}/api/v0/nodes?detail=1"))
        return [n for n in data["data"]["result"]["result"] if n["state"] == "ALIVE"]

    def _wait_nodes(self, n: int) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                if len(self.nodes()) >= n:
                    return
            except (urllib.error.URLError, OSError, KeyError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"Ray cluster did not reach {n} nodes:\n{_tail(self.root / 'ray-worker.log')}")
            time.sleep(1)

    def ray_cli(self, args: list[str], timeout: float) -> subprocess.CompletedProcess:
        return subprocess.run([self._ray(), *args], cwd=self.root, env=self.env, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    # ---- stop -------------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop everything this test started, by recorded ids; safe to call twice. Processes that the
        orderly stop missed (found by this test's token or folders) are killed and listed in `strays`."""
        for started in reversed(self.groups):  # ray worker, ray head, mlflow
            self._stop_group(started)
        if self.pg_data is not None and self.postmaster_pid and _alive(self.postmaster_pid):
            subprocess.run([str(self.pg_bindir / "pg_ctl"), "-D", str(self.pg_data), "-m", "fast", "-w", "-t", "60", "stop"],
                           capture_output=True, timeout=90, **self.pg_user)
        time.sleep(1)
        for pid, cmdline in self._token_processes():
            self.strays.append(f"pid {pid}: {cmdline[:200]}")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.pg_root is not None and not (self.postmaster_pid and _alive(self.postmaster_pid)):
            shutil.rmtree(self.pg_root, ignore_errors=True)

    @staticmethod
    def _stop_group(started: Started) -> None:
        # `ray start --block` drains and stops its node's processes on SIGTERM; mlflow stops its workers.
        if started.proc.poll() is None:
            started.proc.send_signal(signal.SIGTERM)
            try:
                started.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
        deadline = time.monotonic() + 15
        while _group_alive(started.pgid) and time.monotonic() < deadline:
            _signal_group(started.pgid, signal.SIGTERM)
            time.sleep(0.5)
        _signal_group(started.pgid, signal.SIGKILL)
        if started.proc.poll() is None:
            started.proc.wait(timeout=30)

    def leftovers(self) -> list[str]:
        """Every process of ours still alive: by process group, by our folders in its command line, and
        by this test's unique Ray token in its environment (Ray workers start their own sessions and
        rename themselves `ray::...`, so only the token finds them)."""
        time.sleep(1)
        found = [f"{s.name}: process group {s.pgid} still has processes" for s in self.groups if _group_alive(s.pgid)]
        if self.postmaster_pid and _alive(self.postmaster_pid):
            found.append(f"postgres {self.postmaster_pid} still running")
        found += [f"pid {pid}: {cmdline[:200]}" for pid, cmdline in self._token_processes()]
        return found

    def _token_processes(self) -> list[tuple[int, str]]:
        markers = [str(self.root)] + ([str(self.pg_root)] if self.pg_root else [])
        token = f"RAY_AUTH_TOKEN={self.token}".encode()
        found = []
        for proc_dir in Path("/proc").glob("[0-9]*"):
            pid = int(proc_dir.name)
            if pid == os.getpid() or not _alive(pid):
                continue
            try:
                cmdline = (proc_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                environ = (proc_dir / "environ").read_bytes()
            except OSError:
                continue
            if any(m in cmdline for m in markers) or token in environ.split(b"\0"):
                found.append((pid, cmdline))
        return found


def _alive(pid: int) -> bool:
    if not process_exists(pid):
        return False
    try:  # a zombie (exited, not yet reaped by its parent) is not running
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _group_alive(pgid: int) -> bool:
    for proc_dir in Path("/proc").glob("[0-9]*"):
        try:
            fields = (proc_dir / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _write_project(project: Path) -> None:
    """What a user submits with --working-dir: their data (relative paths) and config folder."""
    (project / "data").mkdir(parents=True)
    for split, rows in (("train", 64), ("test", 16)):
        lines = (EMBEDDED_TASK / f"{split}.jsonl").read_text().splitlines()[:rows]
        (project / "data" / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    (project / "myconf" / "experiment").mkdir(parents=True)
    (project / "myconf" / "experiment" / "twonode.yaml").write_text(
        "# @package _global_\n"
        "# ray job submit --working-dir . -- fp8lab sweep --config-dir myconf experiment=twonode tracking.uri=http://HOST:5000\n"
        "train: {steps: 4, log_every: 2, warmup_steps: 1, num_threads: 1}\n"
        "precision: {telemetry: {every: 2}}\n"
        "eval: {limit: 8}\n"
        "data: {path: data}\n"
        f"sweep: {{name: fp8lab-twonode, axes: {{precision: [{', '.join(POLICIES)}], seed: [0]}}, report: true}}\n"
        f"cluster: {{address: auto, pin_trials: [{', '.join(PIN)}]}}\n")


@pytest.fixture
def stack(tmp_path_factory: pytest.TempPathFactory):
    bindir = postgres_bindir()
    if bindir is None:
        _unavailable("PostgreSQL server binaries (initdb, pg_ctl, postgres, psql) not found: apt-get install -y postgresql")
    try:
        import psycopg  # noqa: F401 - MLflow's SQLAlchemy URL postgresql+psycopg needs it
    except ImportError:
        _unavailable("the psycopg driver is not installed: pip install 'psycopg[binary]'")
    # Short and outside pytest's tmp: under xdist the tmp path gains a "popen-gwN" level, and Ray's
    # socket paths below <root>/rayA/session_<date>_<pid>/sockets/ must stay within 107 bytes.
    root = Path(os.path.realpath(tempfile.mkdtemp(prefix="fp8lab-mn-")))
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN_PATH")}
    stack = LocalStack(root, env)
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=stack.token, RAY_USAGE_STATS_ENABLED="0", HF_HUB_OFFLINE="1",
               HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", MLFLOW_ENABLE_ASYNC_LOGGING="false", PYTHONUNBUFFERED="1",
               RAY_DEDUP_LOGS="0")
    try:
        stack.start(bindir)
        yield stack
    finally:
        stack.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_two_node_sweep_tracked_in_postgres_backed_mlflow(stack: LocalStack, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.tracking import MlflowClient

    started = time.monotonic()
    # Access control: Ray's dashboard (Jobs API) wants the cluster token, MLflow's API a user.
    for url in (f"{stack.dashboard}/api/v0/nodes", f"{stack.tracking_uri}/api/2.0/mlflow/experiments/search?max_results=1"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            stack.get(url, auth=False)
        assert refused.value.code == 401, url
    nodes = stack.nodes()
    node_of = {name: n["node_id"] for n in nodes for name in PIN if n["resources_total"].get(name)}
    assert set(node_of) == set(PIN) and node_of["node_a"] != node_of["node_b"]

    # 1. A SQLite store on a multi-node cluster is refused before any run exists (direct connect).
    refused_dir = stack.root / "refused"
    refused_dir.mkdir()
    proc = run_fp8lab(["sweep", f"cluster.address=127.0.0.1:{stack.gcs_port}", "tracking.uri=sqlite:///mlflow.db",
                       "sweep.name=refused", "sweep.axes.precision=[bf16]", "sweep.axes.seed=[0]"], refused_dir, stack.env,
                      check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "tracking.uri: sqlite:///" in proc.stderr and "2 nodes" in proc.stderr and "tracking.uri=http://" in proc.stderr
    refused_db = refused_dir / "mlflow.db"
    assert not refused_db.exists() or not MlflowClient(f"sqlite:///{refused_db}").search_runs(
        [e.experiment_id for e in MlflowClient(f"sqlite:///{refused_db}").search_experiments()]), "a run was created"
    stack.timings["refusal_s"] = time.monotonic() - started

    # 2. The sweep as a Ray job: working dir (data + config) shipped by the runtime environment.
    project = stack.root / "project"
    _write_project(project)
    job_id = f"fp8lab-twonode-{secrets.token_hex(4)}"
    console_script = Path(sys.executable).with_name("fp8lab")
    entry = [str(console_script)] if console_script.exists() else [sys.executable, "-m", "orchestrator.cli"]
    # MLflow credentials reach the driver and every trial through the job's runtime environment
    # (the Ray nodes themselves were started without them).
    runtime_env = stack.root / "runtime_env.yaml"  # JSON is YAML
    runtime_env.write_text(json.dumps({"env_vars": stack.mlflow_credentials}))
    runtime_env.chmod(0o600)
    t_job = time.monotonic()
    submit = stack.ray_cli(["job", "submit", "--address", stack.dashboard, "--working-dir", str(project),
                            "--runtime-env", str(runtime_env), "--submission-id", job_id, "--", *entry, "sweep",
                            "--config-dir", "myconf", "experiment=twonode", f"tracking.uri={stack.tracking_uri}"],
                           timeout=JOB_TIMEOUT_S)
    stack.timings["job_s"] = time.monotonic() - t_job
    assert submit.returncode == 0, f"job failed:\n{submit.stdout[-6000:]}\n{submit.stderr[-3000:]}"

    # Progress and output are retrievable afterwards through the Jobs API.
    status = stack.ray_cli(["job", "status", "--address", stack.dashboard, job_id], timeout=60)
    assert re.search(r"succeeded", status.stdout + status.stderr, re.I), status.stdout + status.stderr
    logs = stack.ray_cli(["job", "logs", "--address", stack.dashboard, job_id], timeout=60).stdout
    for policy in POLICIES:
        assert re.search(rf"{policy}-s0\W+FINISHED", logs), logs[-3000:]
    assert "Report:" in logs

    # 3. Everything is in the server: runs, metrics, artifacts (proxied into the artifact store).
    for key, value in stack.mlflow_credentials.items():
        monkeypatch.setenv(key, value)
    client = MlflowClient(stack.tracking_uri)
    experiment = client.get_experiment_by_name("fp8lab-twonode")
    assert experiment.artifact_location.startswith("mlflow-artifacts:")
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if r.data.tags.get("fp8lab.role") == "sweep"]
    trials = {r.data.tags["fp8lab.policy"]: r for r in runs if r.data.tags.get("fp8lab.role") == "trial"}
    assert len(parents) == 1 and sorted(trials) == sorted(POLICIES)
    parent = parents[0]
    assert parent.info.status == "FINISHED"
    for index, policy in enumerate(POLICIES):
        run = trials[policy]
        tags = run.data.tags
        assert run.info.status == "FINISHED" and tags["fp8lab.status"] == "FINISHED", tags.get("fp8lab.reason")
        assert tags["mlflow.parentRunId"] == parent.info.run_id
        pinned = PIN[index % len(PIN)]
        assert pinned in json.loads(tags["fp8lab.ray_resources"]), tags["fp8lab.ray_resources"]
        assert tags["fp8lab.ray_node_id"] == node_of[pinned], f"{policy} did not run on {pinned}"
        for key in ("eval/accuracy", "train/tokens_per_s", "train/final_loss", "memory/peak_bytes"):
            assert key in run.data.metrics, key
        assert len(client.get_metric_history(run.info.run_id, "train/loss")) == 2  # steps 2 and 4
        assert run.data.params["data.path"] == "data"
        found = {a.path for folder in ("config", "precision", "telemetry", "logs") for a in client.list_artifacts(run.info.run_id, folder)}
        found |= {a.path for a in client.list_artifacts(run.info.run_id)}
        assert TRIAL_ARTIFACTS <= found, TRIAL_ARTIFACTS - found
        trial_log = (stack.artifacts_dir / experiment.experiment_id / run.info.run_id / "artifacts" / "logs" / "trial.log")
        assert "loaded 64 training examples" in trial_log.read_text()  # the job's data/, unpacked on that node
    assert client.list_artifacts(parent.info.run_id, "report"), "the sweep's report was not logged to the parent run"
    for node_tmp in (stack.head_tmp, stack.worker_tmp):  # nothing tracked on a node's own disk
        strays = [p for pattern in ("**/mlruns", "**/mlartifacts", "**/mlflow.db") for p in node_tmp.glob(pattern)]
        assert not strays, strays
    assert list(stack.worker_tmp.glob("session_*/runtime_resources/working_dir_files/_ray_pkg_*/data/train.jsonl"))

    # 4. The report regenerates from the server alone.
    sweep_id = parent.data.tags["fp8lab.sweep_id"]
    out = stack.root / "report-again"
    regen = run_fp8lab(["report", "--sweep", sweep_id, "--out", str(out), f"tracking.uri={stack.tracking_uri}",
                        "sweep.name=fp8lab-twonode"], stack.root, {**stack.env, **stack.mlflow_credentials})
    assert "2 trials" in regen.stdout, regen.stdout
    report_md = (out / "report.md").read_text()
    assert all(policy in report_md for policy in POLICIES)

    # 5. Everything started is stopped.
    stack.stop()
    assert stack.strays == [], "the orderly stop (SIGTERM to each `ray start --block`, mlflow, pg_ctl stop) missed these"
    assert stack.leftovers() == []
    stack.timings["total_s"] = time.monotonic() - started + stack.timings["postgres_s"] + stack.timings["mlflow_and_ray_s"]
    print("two-node test timings: " + ", ".join(f"{k}={v:.0f}s" for k, v in stack.timings.items()))
