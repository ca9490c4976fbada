"""What docker-compose.yml and the Dockerfile must guarantee. These machines have no Docker
daemon, so neither file is run here: both are parsed, and what a deployment relies on is
checked against the code it runs (the settings, the `rag` command, the app's routes) and
against what README.md and docs/ tell an operator to type."""

from __future__ import annotations

import logging
import os
import re
import shlex
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml
from pydantic import BaseModel
from sqlalchemy.engine import make_url

from rag.api.app import create_app
from rag.cli import build_parser
from rag.config import Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
KERNELS = "rag.engine.kernels"  # the module that compiles the engine's C++ kernels
COMPILERS = re.compile(
    r"(?<![\w.+-])(g\+\+|gcc|clang|c\+\+|cc|build-essential|cmake|make)(-[\d.]+)?(?![\w.+-])"
)
# What an operator's shell gives the variables the compose file requires (`${VAR:?...}`);
# every other variable is left unset, so the file's own defaults apply.
# The admin key is as long as README.md's `openssl rand -base64 32` makes it.
SHELL = {"RAG_AUTH__ADMIN_KEY": "test-admin-key-".ljust(44, "x")}


# --- docker-compose.yml ------------------------------------------------------------------


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())  # resolves the `<<: *rag` merge
    return data


def services() -> dict[str, Any]:
    found: dict[str, Any] = compose()["services"]
    return found


def interpolate(value: str, shell: Mapping[str, str] = SHELL) -> str:
    """`value` as Compose reads it: ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?error},
    ${VAR?error}, and $$ for a dollar sign."""

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name, op, arg = m.group("name"), m.group("op") or "", m.group("arg") or ""
        given = shell.get(name)
        missing = given is None or (op.startswith(":") and given == "")
        if op.endswith("?") and missing:
            raise AssertionError(f"compose requires ${name} ({arg}): give it a value in SHELL")
        if op.endswith("-") and missing:
            return arg
        return given or ""

    pattern = r"\$\$|\$\{(?P<name>\w+)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}"
    return re.sub(pattern, one, value)


def environment(service: Mapping[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):  # the ["KEY=value"] form
        env = dict(item.split("=", 1) for item in env)
    return {k: interpolate(str(v)) for k, v in env.items()}


def argv(command: str | list[str]) -> list[str]:
    return shlex.split(command) if isinstance(command, str) else [str(a) for a in command]


def rag_cli(args: list[str]) -> Any:
    """`args` parsed by the `rag` command, which must have them."""
    assert args[:1] == ["rag"], args
    try:
        return build_parser().parse_args(args[1:])
    except SystemExit:
        raise AssertionError(f"the rag CLI has no command {args}") from None


def active(profiles: set[str]) -> set[str]:
    """The services `docker compose --profile P ... up` starts."""
    return {
        name
        for name, svc in services().items()
        if not svc.get("profiles") or set(svc["profiles"]) & profiles
    }


def rag_services() -> dict[str, Any]:
    """The services built from this repository's image."""
    found = {name: svc for name, svc in services().items() if "build" in svc}
    assert found, "no service builds the ragserve image"
    return found


def host_of(url: str) -> str | None:
    m = re.match(r"^[\w+]+://([^/@]+@)?(?P<host>[^/:]+)", url)
    return m.group("host") if m else None


@dataclass
class Documented:
    """One `docker compose ...` command from the docs."""

    source: str
    profiles: set[str] = field(default_factory=set)
    named: set[str] = field(default_factory=set)  # services it names (`--scale S=N`, `up S`)
    scales: dict[str, str] = field(default_factory=dict)  # `--scale S=N`: S -> N

    def scaled(self, name: str) -> bool:
        return self.scales.get(name, "1") != "1"


def documented_commands() -> list[Documented]:
    sources = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), COMPOSE]
    found = []
    for path in sources:
        for m in re.finditer(r"docker compose((?: +[^\s`]+)+)", path.read_text()):
            cmd = Documented(f"{path.name}: {m.group(0)}")
            words = m.group(1).split()
            for i, word in enumerate(words):
                nxt = words[i + 1] if i + 1 < len(words) else ""
                if word == "--profile":
                    cmd.profiles.add(nxt)
                elif word == "--scale":
                    service, _, count = nxt.partition("=")
                    cmd.named.add(service)
                    cmd.scales[service] = count
            if "up" in words:
                after = words[words.index("up") + 1 :]
                skip = {"--scale", "--profile"}
                cmd.named |= {
                    w
                    for j, w in enumerate(after)
                    if not w.startswith("-") and (j == 0 or after[j - 1] not in skip)
                }
            found.append(cmd)
    return found


def setting_path(env_name: str) -> str:
    """The Settings field a RAG_ variable sets, e.g. RAG_API__PORT -> api.port; AssertionError
    when it sets none (pydantic-settings ignores an unknown top-level RAG_ name silently)."""
    assert env_name.startswith("RAG_"), env_name
    model: type[BaseModel] | None = Settings
    path = []
    for part in env_name[4:].lower().split("__"):
        assert model is not None and part in model.model_fields, f"{env_name} sets no setting"
        path.append(part)
        annotation = model.model_fields[part].annotation
        models = [t for t in (annotation, *get_args(annotation)) if _is_model(t)]
        model = models[0] if models else None
    return ".".join(path)


def _is_model(t: object) -> bool:
    return isinstance(t, type) and issubclass(t, BaseModel)


SettingsFrom = Callable[[Mapping[str, str]], tuple[Settings, list[str]]]


@pytest.fixture
def settings_from(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> SettingsFrom:
    """Settings as a process sees them with exactly `env` (RAG_ variables only), and the
    warnings ragserve logged while reading them."""

    def build(env: Mapping[str, str]) -> tuple[Settings, list[str]]:
        for name in [n for n in os.environ if n.startswith("RAG_")]:
            monkeypatch.delenv(name)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            settings = Settings()
        warned = [r.getMessage() for r in caplog.records if r.name.startswith("rag")]
        return settings, warned

    return build


def service_env(name: str) -> dict[str, str]:
    """The RAG_ variables a rag service's process has: the image's, then the service's."""
    env = {k: v for k, v in image_env().items() if k.startswith("RAG_")}
    env.update({k: v for k, v in environment(services()[name]).items() if k.startswith("RAG_")})
    return env


@pytest.mark.parametrize("name", sorted(rag_services()))
def test_every_rag_service_starts_with_valid_settings(
    name: str, settings_from: SettingsFrom
) -> None:
    """Unknown options fail at startup and moved ones warn: each variable the service sets
    (and the image sets under it) is a current setting, and together they validate."""
    env = service_env(name)
    for var in env:
        setting_path(var)
    _, warned = settings_from(env)
    assert not warned, warned


def test_every_setting_the_files_name_is_a_current_one() -> None:
    """Comments tell operators what to set (e.g. the kernel switch for another CPU): each
    RAG_ name in either file is a setting, not a moved or removed one."""
    text = COMPOSE.read_text() + DOCKERFILE.read_text()
    for var in sorted(set(re.findall(r"\bRAG_[A-Z0-9_]+[A-Z0-9]", text))):
        setting_path(var)


def test_rag_services_use_the_database_and_milvus_the_file_runs(
    settings_from: SettingsFrom,
) -> None:
    """Every API replica and worker talks to the compose file's PostgreSQL (with its
    credentials) and, in the scale profile, its Milvus; each waits for those to be healthy,
    and waits for Milvus only when the profile runs it."""
    all_services = services()
    for name in rag_services():
        settings, _ = settings_from(service_env(name))
        db = make_url(settings.database_url)
        assert db.drivername == "postgresql+psycopg" and db.host in all_services, name
        pg = environment(all_services[db.host])
        assert (db.username, db.password, db.database) == (
            pg["POSTGRES_USER"],
            pg["POSTGRES_PASSWORD"],
            pg["POSTGRES_DB"],
        ), name
        assert settings.milvus.uri is not None, name
        milvus = host_of(settings.milvus.uri)
        assert milvus in all_services and all_services[milvus].get("profiles"), name
        depends = all_services[name]["depends_on"]
        for target in (str(db.host), milvus):
            assert depends[target]["condition"] == "service_healthy", (name, target)
            optional = bool(all_services[target].get("profiles"))
            assert depends[target].get("required", True) is not optional, (name, target)


def test_a_dependency_waited_on_has_a_healthcheck_and_runs_when_required() -> None:
    all_services = services()
    for name, svc in all_services.items():
        depends = svc.get("depends_on") or {}
        if isinstance(depends, list):
            depends = {d: {"condition": "service_started"} for d in depends}
        for target, how in depends.items():
            assert target in all_services, (name, target)
            if how.get("condition") == "service_healthy":
                assert "healthcheck" in all_services[target], (name, target)
            if how.get("required", True):  # started with every profile that starts `name`
                own = set(svc.get("profiles") or [])
                theirs = set(all_services[target].get("profiles") or [])
                assert not theirs or (own and own <= theirs), (name, target)


def test_data_lives_in_named_volumes(settings_from: SettingsFrom) -> None:
    """Data outlives containers: every mount is a declared named volume, and each rag
    service's data directory is one."""
    volumes = set(compose().get("volumes") or {})
    for name, svc in services().items():
        for mount in svc.get("volumes") or []:
            assert mount.split(":")[0] in volumes, (name, mount)
    for name, svc in rag_services().items():
        settings, _ = settings_from(service_env(name))
        targets = {mount.split(":")[1] for mount in svc.get("volumes") or []}
        assert str(settings.data_dir) in targets, name


def test_rag_services_run_commands_the_rag_cli_has(settings_from: SettingsFrom) -> None:
    """Each service's command is the `rag` CLI's; the one that publishes a port serves the
    API on it, on an address reachable from outside its container."""
    published = 0
    for name, svc in rag_services().items():
        parsed = rag_cli(argv(svc.get("command") or image_command()))
        for port in svc.get("ports") or []:
            published += 1
            assert parsed.command == "serve", name
            settings, _ = settings_from(service_env(name))
            inside = str(port).rsplit(":", 1)[-1].split("/")[0]
            assert int(inside) == (parsed.port or settings.api.port), (name, port)
            assert (parsed.host or settings.api.host) == "0.0.0.0", name
    assert published, "no rag service publishes the API's port"


def test_the_documented_compose_commands_start_what_they_name() -> None:
    """Each `docker compose` command in README.md, docs/ and the compose file's header names
    only profiles that exist and services those profiles start; what they scale as ingest
    workers runs `rag worker`."""
    commands = documented_commands()
    assert commands, "README.md shows how to start the compose file"
    profiles = {p for svc in services().values() for p in svc.get("profiles") or []}
    for cmd in commands:
        assert cmd.profiles <= profiles, cmd.source
        assert cmd.named <= active(cmd.profiles), cmd.source
    workers = {n for cmd in commands for n in cmd.named if "worker" in n}
    for name in workers:  # what the docs scale as ingest workers runs `rag worker`
        assert argv(services()[name]["command"])[:2] == ["rag", "worker"], name


def test_a_service_the_docs_scale_publishes_no_fixed_host_port() -> None:
    """`--scale S=N` starts N containers of S on one host: a fixed host port in S's `ports`
    lets only the first bind it, the others fail to start."""
    scaled = {n for cmd in documented_commands() for n in cmd.named if cmd.scaled(n)}
    for name in scaled:
        for port in services()[name].get("ports") or []:
            parts = str(port).split(":")
            assert len(parts) == 1 or not parts[-2], (name, port)  # "8000" or "ip::8000"


def test_the_scale_profile_adds_milvus_standalone() -> None:
    """README.md: PostgreSQL, the API and N workers; `--profile scale` adds Milvus Standalone
    (etcd, MinIO, milvus), wired to each other as Milvus's own compose file has them."""
    assert active(set()) == {"postgres", *rag_services()}
    assert active({"scale"}) - active(set()) == {"etcd", "minio", "milvus"}
    all_services = services()
    milvus = all_services["milvus"]
    assert argv(milvus["command"]) == ["milvus", "run", "standalone"]
    env = environment(milvus)
    for endpoint in (env["ETCD_ENDPOINTS"], env["MINIO_ADDRESS"]):
        assert endpoint.split(":")[0] in milvus["depends_on"], endpoint
    minio = environment(all_services["minio"])
    assert env["MINIO_ACCESS_KEY_ID"] == minio["MINIO_ACCESS_KEY"]
    assert env["MINIO_SECRET_ACCESS_KEY"] == minio["MINIO_SECRET_KEY"]


def test_health_probes_name_routes_the_app_serves(settings_from: SettingsFrom) -> None:
    """A HEALTHCHECK in the image, a healthcheck on a rag service, and the probe paths the
    docs give a load balancer all name GET routes of the app."""
    settings, _ = settings_from(image_env())
    paths_served = create_app(settings).openapi()["paths"]
    routes = {path for path, ops in paths_served.items() if "get" in ops}
    probes = [arg for stage in dockerfile() for arg in stage.all("HEALTHCHECK")]
    probes += [" ".join(argv(s["healthcheck"]["test"])) for s in rag_services().values()
               if "healthcheck" in s]  # fmt: skip
    paths = {m for probe in probes for m in re.findall(r"https?://[^/\s\"']+(/[\w/]*)", probe)}
    for doc in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        paths |= set(re.findall(r"probe[^`.]*`(/[\w/]*)`", doc.read_text()))
    assert paths, "no probe found to check"
    assert paths <= routes, paths - routes


def test_every_serving_service_has_a_healthcheck_the_image_can_run() -> None:
    """A service that runs `rag serve` has a healthcheck (compose restarts an unhealthy one
    and `depends_on: service_healthy` waits for it), whose program is one the image holds
    (the slim base has Python, not curl)."""
    serving = {name: s for name, s in rag_services().items() if "serve" in argv(s["command"])}
    assert serving, "no service runs rag serve"
    for name, svc in serving.items():
        assert "healthcheck" in svc, name
        test = argv(svc["healthcheck"]["test"])
        program = test[1] if test[0] in ("CMD", "CMD-SHELL") else test[0]
        assert program.split()[0] == "python", (name, test)


# --- Dockerfile --------------------------------------------------------------------------


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [arg for kw, arg in self.instructions if kw == keyword]

    def env(self) -> dict[str, str]:
        found: dict[str, str] = {}
        for arg in self.all("ENV"):
            words = shlex.split(arg)
            if words and "=" not in words[0]:  # the legacy `ENV KEY value` form
                found[words[0]] = " ".join(words[1:])
            else:
                found.update(w.partition("=")[::2] for w in words)
        return found


def parse(text: str) -> list[Stage]:
    """Instructions by stage, with line continuations joined and comments dropped."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    stages: list[Stage] = []
    for line in logical:
        keyword, _, arg = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            parts = arg.split()
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(parts[0], name))
        else:
            assert stages, f"{keyword} before FROM"
            stages[-1].instructions.append((keyword, arg))
    return stages


def dockerfile() -> list[Stage]:
    return parse(DOCKERFILE.read_text())


def image_env() -> dict[str, str]:
    return dockerfile()[-1].env()


def exec_form(arg: str) -> list[str]:
    """A CMD or ENTRYPOINT in JSON (exec) form: the process is PID 1 and gets SIGTERM itself
    rather than a shell that does not pass it on."""
    assert arg.startswith("["), f"not exec form: {arg}"
    words: list[str] = yaml.safe_load(arg)
    return words


def run_user(stage: Stage) -> str:
    users = stage.all("USER")
    assert users, "the image runs as root"
    return users[-1].split(":")[0]


def image_command() -> list[str]:
    final = dockerfile()[-1]
    entry = [w for arg in final.all("ENTRYPOINT")[-1:] for w in exec_form(arg)]
    return entry + [w for arg in final.all("CMD")[-1:] for w in exec_form(arg)]


def test_the_parser_sees_stages_and_continuations() -> None:
    stages = parse(
        'FROM a AS builder\n# note\nRUN x \\\n && y\nENV A=1 B="two words"\nFROM b\n'
        'ENV C 3\nUSER app\nCMD ["run"]\n'
    )
    assert [(s.base, s.name) for s in stages] == [("a", "builder"), ("b", None)]
    assert stages[0].all("RUN") == ["x  && y"]
    assert stages[0].env() == {"A": "1", "B": "two words"}
    assert stages[1].env() == {"C": "3"}
    assert stages[1].all("USER") == ["app"]


def test_the_image_runs_the_rag_command() -> None:
    args = image_command()
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts.get(args[0]) == "rag.cli:main", args
    rag_cli(args)


def test_the_image_runs_as_an_unprivileged_user_that_owns_its_data(
    settings_from: SettingsFrom,
) -> None:
    final = dockerfile()[-1]
    user = run_user(final)
    assert user not in ("root", "0")
    keywords = [kw for kw, _ in final.instructions]
    last_user = len(keywords) - 1 - keywords[::-1].index("USER")
    for kw in ("CMD", "ENTRYPOINT"):
        if kw in keywords:
            assert last_user < keywords.index(kw), f"{kw} before USER"
    settings, _ = settings_from(image_env())
    data = str(settings.data_dir)
    assert data in " ".join(final.all("VOLUME")), "the data directory is a volume"
    owned = rf"chown +(-\S+ +)*{re.escape(user)}(:\S+)? +(\S+ +)*{re.escape(data)}\b"
    assert any(re.search(owned, run) for run in final.all("RUN")), f"{user} cannot write {data}"


def test_the_image_serves_the_api_on_the_port_it_exposes(settings_from: SettingsFrom) -> None:
    settings, warned = settings_from(image_env())
    assert not warned, warned
    assert settings.api.host == "0.0.0.0"  # reachable from outside the container
    exposed = {p.split("/")[0] for arg in dockerfile()[-1].all("EXPOSE") for p in arg.split()}
    assert str(settings.api.port) in exposed


def test_a_builder_stage_compiles_the_kernels_where_the_image_loads_them() -> None:
    """The kernels are compiled ahead of time in a stage with a compiler; the final image has
    none, copies them to the directory torch's loader looks in, and lets the service user
    own it (the loader takes a lock file there)."""
    stages = dockerfile()
    builder = next(s for s in stages if s.name == "builder")
    final = stages[-1]
    module = ROOT / (KERNELS.replace(".", "/") + ".py")
    assert "__main__" in module.read_text(), f"python -m {KERNELS} does nothing"
    runs = " ".join(builder.all("RUN"))
    assert f"python -m {KERNELS}" in runs
    assert COMPILERS.search(runs), "the builder installs the compiler the kernels need"
    for run in final.all("RUN"):
        installed = " ".join(re.findall(r"apt-get install ([^&;]*)", run))
        assert not COMPILERS.search(installed), run
        assert KERNELS not in run  # nothing is compiled here
    where = builder.env()["TORCH_EXTENSIONS_DIR"]
    assert final.env()["TORCH_EXTENSIONS_DIR"] == where
    user = run_user(final)
    copies = [shlex.split(arg) for arg in final.all("COPY")]
    kernels = [c for c in copies if "--from=builder" in c and c[-1] == where]
    assert kernels, f"the kernels are not copied to {where}"
    owners = [w.split("=")[1].split(":")[0] for w in kernels[0] if w.startswith("--chown=")]
    assert owners == [user], f"{user} does not own {where}"


def test_what_the_image_copies_from_the_repository_exists() -> None:
    for stage in dockerfile():
        for arg in stage.all("COPY") + stage.all("ADD"):
            words = shlex.split(arg)
            if any(w.startswith("--from=") for w in words):
                continue  # from another stage
            for source in [w for w in words if not w.startswith("--")][:-1]:
                assert (ROOT / source).exists(), source
