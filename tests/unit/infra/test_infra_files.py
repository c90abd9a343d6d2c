"""infra/ files that cannot run here (containers, Kubernetes, a cloud cluster launcher) are parsed and
checked: every YAML parses; Kubernetes objects have the required fields and, where the offline
`kubernetes-validate` schemas are installed, match the Kubernetes API schema; KubeRay objects get
structural checks (GPU resources, token auth on every Ray container, string rayStartParams); the
cluster launcher config is validated against Ray's own JSON schema; the RayJob's fp8lab command is
composed and validated with fp8lab's real config loader; Dockerfiles and compose get the checks an
honest reader would do by hand. The MLflow entrypoint script is also run for real by
tests/integration/test_multinode.py.
"""
from __future__ import annotations

import configparser
import json
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
INFRA = ROOT / "infra"
K8S_DIRS = [INFRA / "mlflow" / "k8s", INFRA / "ray" / "kuberay"]
RAY_VERSION = "2.60.0"
GPU = "nvidia.com/gpu"
K8S_VERSION = "1.33.0"

# kind -> apiVersion for every built-in kind used here.
API_VERSIONS = {
    "Namespace": "v1", "Secret": "v1", "ConfigMap": "v1", "Service": "v1",
    "Deployment": "apps/v1", "StatefulSet": "apps/v1", "Job": "batch/v1",
    "NetworkPolicy": "networking.k8s.io/v1",
    "RayCluster": "ray.io/v1", "RayJob": "ray.io/v1",
    "Kustomization": "kustomize.config.k8s.io/v1beta1",
}


def yaml_files() -> list[Path]:
    return sorted(p for p in INFRA.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file())


def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def k8s_objects() -> list[tuple[Path, dict[str, Any]]]:
    return [(p, d) for folder in K8S_DIRS for p in sorted(folder.glob("*.yaml")) for d in docs(p)]


def objects_of(kind: str) -> list[tuple[Path, dict[str, Any]]]:
    return [(p, d) for p, d in k8s_objects() if d["kind"] == kind]


def pod_specs(obj: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(role, pod spec) of every pod an object creates."""
    kind, spec = obj["kind"], obj.get("spec", {})
    if kind in ("Deployment", "StatefulSet", "Job"):
        yield kind, spec["template"]["spec"]
    elif kind == "RayCluster":
        yield from ray_cluster_pods(spec)
    elif kind == "RayJob":
        yield from ray_cluster_pods(spec["rayClusterSpec"])
        if "submitterPodTemplate" in spec:
            yield "submitter", spec["submitterPodTemplate"]["spec"]


def ray_cluster_pods(spec: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    yield "head", spec["headGroupSpec"]["template"]["spec"]
    for group in spec.get("workerGroupSpecs", []):
        yield f"worker:{group['groupName']}", group["template"]["spec"]


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


# ---- every file parses -------------------------------------------------------------------------

def test_infra_has_the_promised_files() -> None:
    for rel in ("README.md", "image/Dockerfile", "mlflow/Dockerfile", "mlflow/compose.yaml", "mlflow/entrypoint.sh",
                "mlflow/k8s/kustomization.yaml", "ray/cluster-launcher.yaml", "ray/kuberay/raycluster.yaml",
                "ray/kuberay/rayjob.yaml"):
        assert (INFRA / rel).is_file(), rel


@pytest.mark.parametrize("path", yaml_files(), ids=lambda p: str(p.relative_to(INFRA)))
def test_yaml_parses_and_says_how_to_use_it(path: Path) -> None:
    text = path.read_text()
    assert "\t" not in text, "tabs in YAML"
    assert docs(path), "empty YAML"
    assert text.lstrip().startswith("#"), "start with a comment giving the command that uses this file"
    assert re.search(r"(kubectl|docker|ray) ", text.split("\n\n")[0]), "the opening comment names the command"


# ---- Kubernetes objects ------------------------------------------------------------------------

def test_k8s_objects_have_required_fields_and_known_api_versions() -> None:
    names: set[tuple[str, str]] = set()
    for path, obj in k8s_objects():
        where = f"{path.name}:{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
        assert obj.get("kind") in API_VERSIONS, where
        assert obj.get("apiVersion") == API_VERSIONS[obj["kind"]], where
        if obj["kind"] == "Kustomization":
            continue
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", obj["metadata"]["name"]), where
        if obj["kind"] != "Namespace":
            assert obj["metadata"].get("namespace") == "fp8lab", where
        key = (obj["kind"], obj["metadata"]["name"])
        assert key not in names, f"duplicate {key}"
        names.add(key)
        for role, pod in pod_specs(obj):
            assert pod.get("containers"), f"{where} {role}: no containers"
            for container in pod["containers"]:
                assert container.get("name") and container.get("image"), f"{where} {role}"
                assert not container["image"].endswith(":latest") and ":" in container["image"], f"{where}: pin the image tag"
                for name, item in env_of(container).items():
                    assert ("value" in item) != ("valueFrom" in item), f"{where}: env {name}"
                    if "value" in item:
                        assert isinstance(item["value"], str), f"{where}: env {name} must be a string"


def test_builtin_k8s_objects_match_the_kubernetes_api_schema() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="offline K8s schemas: pip install kubernetes-validate")
    checked = 0
    for path, obj in k8s_objects():
        if obj["apiVersion"].startswith(("ray.io/", "kustomize.")):
            continue  # CRDs / kustomize: checked structurally below
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        checked += 1
    assert checked >= 10


def test_kustomizations_list_existing_files_and_never_the_secret_examples() -> None:
    for folder in K8S_DIRS:
        (kustomization,) = docs(folder / "kustomization.yaml")
        for resource in kustomization["resources"]:
            assert (folder / resource).is_file(), resource
            assert "secret" not in resource
        listed = set(kustomization["resources"])
        leftover = {p.name for p in folder.glob("*.yaml")} - listed - {"kustomization.yaml", "secret.example.yaml", "rayjob.yaml"}
        assert not leftover, f"not in {folder.name}/kustomization.yaml: {leftover}"


def test_secret_examples_hold_only_placeholders() -> None:
    for path in INFRA.rglob("secret.example.yaml"):
        for secret in docs(path):
            assert secret["kind"] == "Secret"
            for key, value in secret["stringData"].items():
                if any(word in key.upper() for word in ("PASSWORD", "TOKEN", "SECRET", "URI")):
                    assert "CHANGE_ME" in value, f"{path.name}: {key} must be a placeholder"
    for line in (INFRA / "mlflow" / ".env.example").read_text().splitlines():
        if "=" in line and not line.startswith("#") and any(w in line for w in ("PASSWORD", "SECRET")):
            assert line.endswith("=CHANGE_ME"), line
    assert ".env" in (INFRA / "mlflow" / ".gitignore").read_text().split()


def test_secret_refs_point_at_keys_the_example_secrets_define() -> None:
    defined = {(s["metadata"]["name"], key) for p in INFRA.rglob("secret.example.yaml") for s in docs(p) for key in s["stringData"]}
    for path, obj in k8s_objects():
        for _, pod in pod_specs(obj):
            for container in pod["containers"]:
                for name, item in env_of(container).items():
                    ref = item.get("valueFrom", {}).get("secretKeyRef")
                    if ref:
                        assert (ref["name"], ref["key"]) in defined, f"{path.name}: env {name} -> {ref}"


# ---- MLflow server: internal address, auth, proxied S3 artifacts --------------------------------

def test_mlflow_services_are_cluster_internal() -> None:
    services = objects_of("Service")
    assert {s["metadata"]["name"] for _, s in services} >= {"mlflow", "postgres", "minio"}
    for _, service in services:
        assert service["spec"].get("type", "ClusterIP") == "ClusterIP", service["metadata"]["name"]
    assert not objects_of("Ingress")
    policies = {p["metadata"]["name"]: p for _, p in objects_of("NetworkPolicy")}
    assert set(policies) == {"mlflow-ingress", "postgres-ingress", "minio-ingress"}
    for name in ("postgres", "minio"):
        sources = [peer for rule in policies[f"{name}-ingress"]["spec"]["ingress"] for peer in rule["from"]]
        assert {"app.kubernetes.io/name": "mlflow"} in [peer.get("podSelector", {}).get("matchLabels") for peer in sources]


def test_mlflow_deployment_uses_postgres_s3_and_basic_auth_from_secrets() -> None:
    (_, deployment), = objects_of("Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = env_of(container)
    for secret_env in ("MLFLOW_BACKEND_STORE_URI", "MLFLOW_AUTH_DATABASE_URI", "MLFLOW_AUTH_ADMIN_PASSWORD",
                       "MLFLOW_FLASK_SERVER_SECRET_KEY", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert "secretKeyRef" in env[secret_env]["valueFrom"], secret_env
    assert env["MLFLOW_ARTIFACTS_DESTINATION"]["value"].startswith("s3://")
    assert env["MLFLOW_S3_ENDPOINT_URL"]["value"] == "http://minio:9000"
    allowed = env["MLFLOW_SERVER_ALLOWED_HOSTS"]["value"].split(",")
    assert "mlflow.fp8lab.svc:5000" in allowed and "*" not in allowed
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"


def test_entrypoint_script_writes_auth_config_and_starts_basic_auth_server() -> None:
    script = INFRA / "mlflow" / "entrypoint.sh"
    subprocess.run(["sh", "-n", str(script)], check=True)
    text = script.read_text()
    assert "--app-name basic-auth" in text and "--serve-artifacts" in text and "umask 077" in text
    for required in ("MLFLOW_BACKEND_STORE_URI", "MLFLOW_AUTH_DATABASE_URI", "MLFLOW_AUTH_ADMIN_PASSWORD",
                     "MLFLOW_FLASK_SERVER_SECRET_KEY"):
        assert f"${{{required}:?" in text, f"{required} must be required, not defaulted"
    proc = subprocess.run(["sh", str(script)], env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
    assert proc.returncode != 0 and "MLFLOW_BACKEND_STORE_URI" in proc.stderr  # refuses without its secrets


def test_entrypoint_config_caches_verified_credentials_for_the_ttl_asked(tmp_path: Path) -> None:
    """Without MLflow's credential cache every request runs a PBKDF2 check (the two-node test's
    server: 67 s of CPU, 10 s with it). The written config turns it on for 60 s by default and
    honours MLFLOW_AUTH_CACHE_TTL_SECONDS, 0 included. A stub `mlflow` prints the config it is given."""
    stub = tmp_path / "bin" / "mlflow"
    stub.parent.mkdir()
    stub.write_text('#!/bin/sh\ncat "$MLFLOW_AUTH_CONFIG_PATH"\n')
    stub.chmod(0o755)
    env = {"PATH": f"{stub.parent}:/usr/bin:/bin", "MLFLOW_AUTH_CONFIG_DIR": str(tmp_path),
           "MLFLOW_BACKEND_STORE_URI": "postgresql+psycopg://u:p@h/mlflow", "MLFLOW_AUTH_DATABASE_URI": "postgresql+psycopg://u:p@h/auth",
           "MLFLOW_AUTH_ADMIN_PASSWORD": "pw", "MLFLOW_FLASK_SERVER_SECRET_KEY": "key"}
    for asked, written in ((None, "60"), ("0", "0"), ("300", "300")):
        extra = {"MLFLOW_AUTH_CACHE_TTL_SECONDS": asked} if asked is not None else {}
        proc = subprocess.run(["sh", str(INFRA / "mlflow" / "entrypoint.sh")], env={**env, **extra},
                              capture_output=True, text=True, check=True)
        config = configparser.ConfigParser()
        config.read_string(proc.stdout)
        assert config.get("mlflow", "auth_cache_ttl_seconds") == written, proc.stdout
        assert config.get("mlflow", "database_uri") == env["MLFLOW_AUTH_DATABASE_URI"]


def test_compose_publishes_only_mlflow_and_only_on_an_internal_address() -> None:
    (compose,) = docs(INFRA / "mlflow" / "compose.yaml")
    services = compose["services"]
    assert set(services) >= {"postgres", "minio", "minio-init", "mlflow"}
    for name in ("postgres", "minio", "minio-init"):
        assert "ports" not in services[name], f"{name} must not be published"
        assert services[name]["networks"] == ["backend"]
    assert compose["networks"]["backend"]["internal"] is True
    (port,) = services["mlflow"]["ports"]
    host, _, _ = port.rpartition(":")[0].rpartition(":")
    assert host.replace("${MLFLOW_BIND:-", "").rstrip("}") == "127.0.0.1", port
    env = services["mlflow"]["environment"]
    assert env["MLFLOW_ARTIFACTS_DESTINATION"].startswith("s3://") and env["MLFLOW_S3_ENDPOINT_URL"] == "http://minio:9000"
    assert env["MLFLOW_BACKEND_STORE_URI"].startswith("postgresql+psycopg://")
    assert services["mlflow"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert (INFRA / "mlflow" / services["mlflow"]["build"]["dockerfile"]).is_file()
    for volume in services["postgres"]["volumes"]:
        source = volume.split(":")[0]
        if source.startswith("./"):
            assert (INFRA / "mlflow" / source).is_dir(), source


def test_compose_secrets_are_required_variables_listed_in_the_env_example() -> None:
    text = (INFRA / "mlflow" / "compose.yaml").read_text()
    example = {line.split("=", 1)[0] for line in (INFRA / "mlflow" / ".env.example").read_text().splitlines()
               if "=" in line and not line.startswith("#")}
    used = set(re.findall(r"\$\{([A-Z_]+)", text))
    secrets = {v for v in used if any(w in v for w in ("PASSWORD", "SECRET", "_USER"))}
    assert secrets and secrets <= example
    for name in secrets:
        assert re.search(rf"\$\{{{name}:\?", text), f"{name} must be required (${{{name}:?...}})"
    assert not re.search(r"(PASSWORD|SECRET_KEY)[\"']?:\s*[\"']?[A-Za-z0-9]{6,}", text), "a literal secret in compose.yaml"


# ---- KubeRay: GPU workers, token auth, the sweep command -----------------------------------------

def ray_objects() -> list[tuple[Path, dict[str, Any]]]:
    return [(p, o) for p, o in k8s_objects() if o["apiVersion"] == "ray.io/v1"]


def test_kuberay_objects_are_well_formed() -> None:
    kinds = sorted(o["kind"] for _, o in ray_objects())
    assert kinds == ["RayCluster", "RayJob"]
    for path, obj in ray_objects():
        spec = obj["spec"] if obj["kind"] == "RayCluster" else obj["spec"]["rayClusterSpec"]
        assert spec["rayVersion"] == RAY_VERSION, path.name
        groups = [spec["headGroupSpec"]] + spec["workerGroupSpecs"]
        for group in groups:
            for key, value in group["rayStartParams"].items():
                assert isinstance(value, str), f"{path.name}: rayStartParams.{key} must be a string (KubeRay)"
        assert spec["headGroupSpec"]["rayStartParams"].get("num-cpus") == "0", "no trial on the head"
        for group in spec["workerGroupSpecs"]:
            assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"], group["groupName"]
        for role, pod in ray_cluster_pods(spec):
            for container in pod["containers"]:
                assert container["image"].split(":")[-1] == "0.1.0" and container["image"].startswith("fp8lab/worker")


def test_kuberay_gpu_workers_request_gpus_and_tolerate_the_gpu_taint() -> None:
    for path, obj in ray_objects():
        spec = obj["spec"] if obj["kind"] == "RayCluster" else obj["spec"]["rayClusterSpec"]
        for role, pod in ray_cluster_pods(spec):
            (container,) = pod["containers"]
            limits = container["resources"]["limits"]
            if role == "head":
                assert GPU not in limits, f"{path.name}: the head needs no GPU"
                continue
            assert int(limits[GPU]) >= 1, f"{path.name} {role}"
            assert container["resources"]["requests"].get(GPU, limits[GPU]) == limits[GPU], "extended resources: requests == limits"
            assert {"key": GPU, "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
            assert any(m["mountPath"] == "/dev/shm" for m in container.get("volumeMounts", []))


def test_kuberay_token_auth_on_every_ray_container() -> None:
    seen = 0
    for path, obj in ray_objects():
        for role, pod in pod_specs(obj):
            for container in pod["containers"]:
                env = env_of(container)
                assert env.get("RAY_AUTH_MODE", {}).get("value") == "token", f"{path.name} {role}"
                ref = env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]
                assert ref == {"name": "fp8lab-ray-token", "key": "auth_token"}, f"{path.name} {role}"
                seen += 1
        spec = obj["spec"] if obj["kind"] == "RayCluster" else obj["spec"]["rayClusterSpec"]
        if spec.get("enableInTreeAutoscaling"):
            env = {e["name"]: e for e in spec["autoscalerOptions"]["env"]}
            assert env["RAY_AUTH_MODE"]["value"] == "token" and "secretKeyRef" in env["RAY_AUTH_TOKEN"]["valueFrom"]
    assert seen >= 5  # cluster head+worker, job head+worker+submitter


def test_trial_pods_get_mlflow_credentials_from_a_secret() -> None:
    for path, obj in ray_objects():
        for role, pod in pod_specs(obj):
            if role == "submitter":
                continue
            env = env_of(pod["containers"][0])
            for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
                assert env[name]["valueFrom"]["secretKeyRef"]["name"] == "mlflow-client", f"{path.name} {role}"


def test_rayjob_runs_a_valid_fp8lab_sweep_against_the_mlflow_service() -> None:
    from orchestrator.config_loader import compose_config, to_container
    from orchestrator.schema import validate_config

    (_, job), = objects_of("RayJob")
    spec = job["spec"]
    assert spec["shutdownAfterJobFinishes"] is True and spec["ttlSecondsAfterFinished"] > 0
    words = shlex.split(spec["entrypoint"])
    assert words[:2] == ["fp8lab", "sweep"]
    config = to_container(compose_config(words[2:]))
    assert validate_config(config) == []
    assert config["cluster"]["address"] == "auto" and config["cluster"]["gpus_per_trial"] == 1
    assert config["tracking"]["uri"] == "http://mlflow.fp8lab.svc:5000"
    (service,) = [s for _, s in objects_of("Service") if s["metadata"]["name"] == "mlflow"]
    assert service["spec"]["ports"][0]["port"] == 5000
    if "runtimeEnvYAML" in spec:
        runtime_env = yaml.safe_load(spec["runtimeEnvYAML"])
        assert "PASSWORD" not in json.dumps(runtime_env).upper()


# ---- Ray cluster launcher ----------------------------------------------------------------------

def test_cluster_launcher_config_matches_rays_schema() -> None:
    import jsonschema
    import ray

    schema = json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())
    (config,) = docs(INFRA / "ray" / "cluster-launcher.yaml")
    jsonschema.validate(config, schema)
    assert ray.__version__ == RAY_VERSION, "the manifests pin the Ray version fp8lab is tested with"


def test_cluster_launcher_has_head_and_gpu_worker_with_token_auth() -> None:
    (config,) = docs(INFRA / "ray" / "cluster-launcher.yaml")
    types = config["available_node_types"]
    assert config["head_node_type"] in types
    assert types[config["head_node_type"]]["resources"] == {"CPU": 0}
    gpu_types = [t for name, t in types.items() if name != config["head_node_type"]]
    assert gpu_types and all(t["node_config"]["InstanceType"].startswith(("g6", "p5", "p4de", "g7")) for t in gpu_types)
    assert all(t["max_workers"] >= t["min_workers"] for t in gpu_types)
    for command in config["head_start_ray_commands"] + config["worker_start_ray_commands"]:
        if "ray start" in command:
            assert "RAY_AUTH_MODE=token ray start" in command, command
    (head_start,) = [c for c in config["head_start_ray_commands"] if "ray start" in c]
    assert "--dashboard-host=127.0.0.1" in head_start
    assert config["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token"
    assert config["docker"]["image"].startswith("fp8lab/worker:")


# ---- Dockerfiles -------------------------------------------------------------------------------

def dockerfile(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    logical, current = [], ""
    for line in path.read_text().splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line.rstrip("\\").strip() + " "
        if not line.rstrip().endswith("\\"):
            logical.append(current.strip())
            current = ""
    assert not current, "dangling line continuation"
    return [(text.split(None, 1)[0].upper(), text.split(None, 1)[1] if " " in text else "") for text in logical]


KNOWN_INSTRUCTIONS = {"FROM", "ARG", "ENV", "RUN", "COPY", "ADD", "USER", "WORKDIR", "EXPOSE", "CMD", "ENTRYPOINT",
                      "HEALTHCHECK", "LABEL", "SHELL", "VOLUME", "STOPSIGNAL", "ONBUILD"}


@pytest.mark.parametrize("path, context", [(INFRA / "image" / "Dockerfile", ROOT), (INFRA / "mlflow" / "Dockerfile", INFRA / "mlflow")],
                         ids=["worker", "mlflow"])
def test_dockerfile_is_well_formed(path: Path, context: Path) -> None:
    instructions = dockerfile(path)
    assert {i for i, _ in instructions} <= KNOWN_INSTRUCTIONS
    args = {}
    for instruction, rest in instructions:
        if instruction == "ARG" and "=" in rest:
            key, value = rest.split("=", 1)
            args[key] = value
    froms = [rest for instruction, rest in instructions if instruction == "FROM"]
    before_from = [i for i, _ in instructions[: [i for i, _ in instructions].index("FROM")]]
    assert froms and set(before_from) <= {"ARG"}, "only ARGs may precede FROM"
    for image in froms:
        resolved = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image.split()[0])
        resolved = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], resolved)
        assert ":" in resolved and not resolved.endswith(":latest"), f"pin the base image: {resolved}"
    users = [rest for instruction, rest in instructions if instruction == "USER"]
    assert users and users[-1] not in ("root", "0"), "run as an unprivileged user"
    for instruction, rest in instructions:
        if instruction == "COPY":
            sources = [w for w in shlex.split(rest) if not w.startswith("--")][:-1]
            for source in sources:
                assert (context / source).exists(), f"COPY source {source} not in the build context {context}"


def test_worker_image_matches_the_cluster_ray_version_and_installs_fp8lab() -> None:
    instructions = dockerfile(INFRA / "image" / "Dockerfile")
    args = dict(rest.split("=", 1) for instruction, rest in instructions if instruction == "ARG" and "=" in rest)
    assert args["RAY_VERSION"] == RAY_VERSION
    runs = " ".join(rest for instruction, rest in instructions if instruction == "RUN")
    assert '"torch==${TORCH_VERSION}" --index-url' in runs and "/tmp/fp8lab[torchao]" in runs
    assert 'if [ "${WITH_TE}" = "true" ]' in runs and "transformer-engine[pytorch]" in runs
    ignore = [line for line in (INFRA / "image" / "Dockerfile.dockerignore").read_text().splitlines()
              if line and not line.startswith("#")]
    assert ignore[0] == "**", "exclude everything, then allow what the image copies"
    for copied in ("pyproject.toml", "README.md", "!conf/**", "!orchestrator/**", "!workloads/**", "!analysis/**"):
        assert copied.lstrip("!") in {line.lstrip("!") for line in ignore}, copied


def test_readme_says_what_ran_and_what_was_only_validated() -> None:
    text = (INFRA / "README.md").read_text()
    assert "What was run here" in text and "only validated" in text.lower()
    for rel in ("image/Dockerfile", "mlflow/compose.yaml", "ray/cluster-launcher.yaml", "ray/kuberay/rayjob.yaml"):
        assert rel in text, rel
