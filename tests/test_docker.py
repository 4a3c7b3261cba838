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
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}
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
