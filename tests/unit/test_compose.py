"""docker-compose.yml's structure. These machines have no Docker daemon, so the file is not
run here: it is parsed, and what the deployment relies on is checked (the services, the
`scale` profile with Milvus Standalone, and every API replica and worker pointed at it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from rag.config import Settings

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return data


def test_default_services_run_without_a_profile() -> None:
    services = compose()["services"]
    for name in ("postgres", "api", "worker"):
        assert "profiles" not in services[name], name
    assert services["api"]["command"][:2] == ["rag", "serve"]
    assert services["worker"]["command"] == ["rag", "worker"]


def test_scale_profile_adds_milvus_standalone() -> None:
    services = compose()["services"]
    for name in ("etcd", "minio", "milvus"):
        assert services[name]["profiles"] == ["scale"], name
        assert "healthcheck" in services[name], name
    milvus = services["milvus"]
    assert milvus["image"].startswith("milvusdb/milvus:v")
    assert milvus["command"] == ["milvus", "run", "standalone"]
    assert milvus["environment"]["ETCD_ENDPOINTS"] == "etcd:2379"
    assert milvus["environment"]["MINIO_ADDRESS"] == "minio:9000"
    assert set(milvus["depends_on"]) == {"etcd", "minio"}
    volumes = set(compose()["volumes"])
    for service in ("etcd", "minio", "milvus"):
        for mount in services[service]["volumes"]:
            assert mount.split(":")[0] in volumes  # named volumes: data outlives containers


def test_api_and_workers_point_at_milvus_in_the_scale_profile() -> None:
    services = compose()["services"]
    for name in ("api", "worker"):
        env = services[name]["environment"]
        assert env["RAG_MILVUS__URI"] == "${RAG_MILVUS__URI:-http://milvus:19530}"
        assert env["RAG_DATABASE__URL"].startswith("postgresql+psycopg://")
        milvus = services[name]["depends_on"]["milvus"]
        # Waits for Milvus when the profile runs it; without the profile it is not required.
        assert milvus == {"condition": "service_healthy", "required": False}


def test_the_environment_it_sets_is_valid_configuration() -> None:
    """Unknown options fail at startup: every RAG_ variable the file sets must be one."""
    env = dict(compose()["services"]["api"]["environment"])
    values = {
        "database": {"url": env["RAG_DATABASE__URL"]},
        "milvus": {"uri": "http://milvus:19530"},
        "data_dir": env["RAG_DATA_DIR"],
    }
    settings = Settings(**values)  # type: ignore[arg-type]
    assert settings.milvus.uri == "http://milvus:19530"
    known = {"RAG_DATABASE__URL", "RAG_AUTH__ADMIN_KEY", "RAG_DATA_DIR", "RAG_MILVUS__URI"}
    assert set(env) <= known, set(env) - known
