"""What the real container test (`make test-container`, tests/container/) does not cover:
the compose and Kubernetes examples agree with the Dockerfile, and the build context leaves
the env files (keys) out of the image. Building and running the image is that test's job."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]


def final_stage() -> dict[str, str]:
    """The last stage's instructions (continuation lines joined), by keyword."""
    joined = ROOT.joinpath("Dockerfile").read_text().replace("\\\n", " ")
    stage: dict[str, str] = {}
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            if keyword.upper() == "FROM":
                stage = {}
            stage[keyword.upper()] = " ".join(rest.split())
    return stage


def image_uid_gid() -> tuple[int, int]:
    uid, gid = final_stage()["USER"].split(":")
    return int(uid), int(gid)


def deployment() -> dict[str, Any]:
    documents = yaml.safe_load_all(ROOT.joinpath("deploy", "kubernetes.yaml").read_text())
    return next(doc for doc in documents if doc["kind"] == "Deployment")


def test_the_image_user_is_numeric_and_the_healthcheck_probes_health() -> None:
    stage = final_stage()
    assert image_uid_gid() == (10001, 10001)  # numeric: what runAsNonRoot can check
    assert stage["EXPOSE"] == "8082"
    assert "/health" in stage["HEALTHCHECK"]
    assert json.loads(stage["ENTRYPOINT"]) == ["claude-proxy"]


def test_kubernetes_runs_the_image_as_its_user_on_its_port() -> None:
    pod = deployment()["spec"]["template"]["spec"]
    uid, gid = image_uid_gid()
    assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": uid,
                                      "runAsGroup": gid}
    (container,) = pod["containers"]
    assert container["ports"] == [{"name": "http", "containerPort": int(final_stage()["EXPOSE"])}]
    # Readiness fails at SIGTERM (503 draining), liveness does not (server/drain.py).
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/health/live", "port": "http"}
    # The container test runs the image the same way (two workers, read-only, no capabilities).
    assert container["args"] == ["--workers", "2"]
    assert container["securityContext"] == {"readOnlyRootFilesystem": True,
                                            "allowPrivilegeEscalation": False,
                                            "capabilities": {"drop": ["ALL"]}}


def test_compose_uses_a_profile_the_port_and_no_host_folder() -> None:
    compose = yaml.safe_load(ROOT.joinpath("docker-compose.yml").read_text())
    service = compose["services"]["claude-proxy"]
    profile = ROOT / service["env_file"]
    assert profile.is_file() and "OPENAI_BASE_URL=" in profile.read_text()
    assert service["ports"] == [f"{final_stage()['EXPOSE']}:8082"]
    # A host folder is owned by whoever cloned the repo, not uid 10001: named volumes only.
    volumes = [entry.split(":") for entry in service["volumes"]]
    assert all(source in compose["volumes"] for source, _ in volumes)
    log_folder = str(Path(service["environment"]["LOG_FILE"]).parent)
    assert [target for _, target in volumes] == [log_folder]
    assert f"mkdir -p {log_folder} && chown 10001:10001 {log_folder}" in final_stage()["RUN"]


def test_the_build_context_leaves_keys_and_caches_out() -> None:
    ignored = ROOT.joinpath(".dockerignore").read_text().split()
    for entry in (".env", ".env.*", ".venv", ".cache", ".git", "tests"):
        assert entry in ignored


def shipped_redis_arguments() -> dict[str, list[str]]:
    """The redis-server arguments deploy/kubernetes.yaml and docker-compose.yml run Redis
    with (tests/soak.py runs its Redis with them)."""
    documents = yaml.safe_load_all(ROOT.joinpath("deploy", "kubernetes.yaml").read_text())
    redis = next(doc for doc in documents if doc["kind"] == "StatefulSet")
    (container,) = redis["spec"]["template"]["spec"]["containers"]
    compose = yaml.safe_load(ROOT.joinpath("docker-compose.yml").read_text())
    command = compose["services"]["redis"]["command"]
    assert command[0] == "redis-server"
    return {"kubernetes": container["args"], "compose": command[1:]}


def options(arguments: list[str]) -> dict[str, str]:
    return dict(zip(arguments[::2], arguments[1::2], strict=True))


def test_the_shipped_redis_keeps_spend_on_a_volume_and_evicts_nothing() -> None:
    shipped = shipped_redis_arguments()
    assert shipped["kubernetes"] == shipped["compose"]
    found = options(shipped["compose"])
    assert found["--appendonly"] == "yes" and found["--appendfsync"] == "always"
    assert found["--maxmemory-policy"] == "noeviction" and found["--dir"] == "/data"
    documents = list(yaml.safe_load_all(
        ROOT.joinpath("deploy", "kubernetes.yaml").read_text()))
    redis = next(doc for doc in documents if doc["kind"] == "StatefulSet")
    (claim,) = redis["spec"]["volumeClaimTemplates"]
    (container,) = redis["spec"]["template"]["spec"]["containers"]
    assert container["volumeMounts"] == [{"name": claim["metadata"]["name"],
                                          "mountPath": "/data"}]
    compose = yaml.safe_load(ROOT.joinpath("docker-compose.yml").read_text())
    (volume,) = compose["services"]["redis"]["volumes"]
    name, target = volume.split(":")
    assert target == "/data" and name in compose["volumes"]


def test_the_grace_periods_cover_the_drain() -> None:
    """Kubernetes and Docker wait for DRAIN_TIMEOUT and the last events before SIGKILL."""
    from claude_proxy.config.settings import Settings
    from claude_proxy.server.drain import FINAL_WRITES
    default = Settings.model_fields["drain_timeout"].default + FINAL_WRITES
    pod = deployment()["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] >= default
    readiness = pod["containers"][0]["readinessProbe"]
    delay = Settings.model_fields["drain_delay"].default
    assert readiness["periodSeconds"] * readiness["failureThreshold"] < delay
    compose = yaml.safe_load(ROOT.joinpath("docker-compose.yml").read_text())
    assert float(compose["services"]["claude-proxy"]["stop_grace_period"].rstrip("s")) >= default
