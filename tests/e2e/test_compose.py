"""docker-compose.yml as compose itself reads it, and its commands run as written against this checkout's wheel,
without a Docker engine.

Compose's own `config` (the Docker CLI's compose plugin, else Debian's docker-compose, which scripts/test.sh
installs without the engine) parses, validates and interpolates the file: a bad key, a variable without a
default or a shell variable left unescaped fails here. Each service's `command` and `environment`, as `config`
gives them with a user's .env (USER_ENV), then run in a venv of its own (installed.venv: the image's Python,
seeing the tested packages), with each volume's mount point mapped to a temp folder, the checkout's mount to a
copy of it, and the other services' host names to loopback. What needs an engine and is not run here: the
postgres image (the service runs on SQLite instead) and the vllm image (a ROCm GPU and a model; its log is
written by the test)."""

from __future__ import annotations

import functools
import io
import os
import re
import shlex
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.conftest import ROOT
from tests.e2e import installed
from tests.e2e.test_capture_agent import bf16_miss

pytestmark = pytest.mark.e2e
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
NEEDS_ENGINE = {"postgres": "the postgres:16 image (here the service runs on SQLite)",
                "vllm": "a ROCm GPU, the vLLM image and a model (here the test writes the server's log)",
                "worker-rocm": "a ROCm GPU and the served image (here the CPU worker runs the same command)"}
# what a user's .env says on a host where the capture agent has no rocminfo
USER_ENV = {"TUNER_GFX": "gfx942", "TUNER_CU_NUM": "304"}


def compose_cli() -> list[str]:
    """The compose plugin where the Docker CLI has it, else the standalone docker-compose; never a skip."""
    docker, standalone = shutil.which("docker"), shutil.which("docker-compose")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    if standalone:
        return [standalone]
    pytest.fail("no compose: `docker compose` or `docker-compose` is needed to check docker-compose.yml "
                "(scripts/test.sh installs Debian's: apt-get install --no-install-recommends docker-compose)")


def compose_config(user_env: dict[str, str], tmp) -> subprocess.CompletedProcess:
    """`compose config` on the checkout's file, in a shell holding only user_env (and no .env file)."""
    env_file = tmp / "empty.env"
    env_file.write_text("")
    return subprocess.run([*compose_cli(), "--env-file", str(env_file), "--profile", "serve", "--profile", "rocm",
                           "config"], cwd=ROOT,
                          capture_output=True, text=True, env={"PATH": os.environ["PATH"], **user_env})


@functools.cache
def services() -> dict:
    """Each service as compose's `config` gives it with the user's .env."""
    with tempfile.TemporaryDirectory() as tmp:
        p = compose_config(USER_ENV, Path(tmp))
    assert p.returncode == 0, p.stderr
    return yaml.safe_load(p.stdout)["services"]


def unescaped(value) -> str:
    """What the container sees: `config` writes a literal $ as $$ again."""
    return str(value).replace("$$", "$")


def argv(value) -> list[str]:
    """A command or healthcheck as compose passes it: v1 keeps the string, the plugin gives a list."""
    return [unescaped(a) for a in (shlex.split(value) if isinstance(value, str) else value)]


def mounts(svc: dict) -> list[tuple[str, str, bool]]:
    """(source, target, read-only) for each volume: v1's 'source:target:mode', the plugin's mapping."""
    out = []
    for v in svc.get("volumes", []):
        if isinstance(v, str):
            source, target, mode = (v.split(":") + ["rw"])[:3]
            out.append((source, target, mode == "ro"))
        else:
            out.append((v["source"], v["target"], bool(v.get("read_only"))))
    return out


def test_compose_validates_the_file_in_a_bare_shell(tmp_path):
    """A bare shell (no .env): every variable compose reads has a default, every one the shell reads is escaped."""
    p = compose_config({}, tmp_path)
    assert p.returncode == 0, p.stderr
    assert "not set" not in p.stderr, p.stderr
    assert set(yaml.safe_load(p.stdout)["services"]) == set(COMPOSE["services"])


def test_the_compose_file_is_consistent():
    svcs = services()
    assert set(svcs) - set(NEEDS_ENGINE) == {"wheel", "service", "worker", "capture"}
    for name, svc in svcs.items():
        assert "image" in svc and ("command" in svc or name in NEEDS_ENGINE), name
        for source, target, ro in mounts(svc):
            assert source in COMPOSE["volumes"] or source == str(ROOT), (name, source)
            if source == str(ROOT):
                assert ro, "the checkout is mounted read-only"
        assert "install -q aiter-tuner" not in " ".join(argv(svc.get("command", ""))), \
            "never a package index's aiter-tuner"


def test_a_rocm_worker_gets_the_gpu_as_amds_container_docs_say():
    """ROCm's docker docs: --device=/dev/kfd --device=/dev/dri --group-add video (as compose keys, not comments);
    the rest of it is the CPU worker's: one command, one token, one service."""
    svcs = services()
    gpu, cpu = svcs["worker-rocm"], svcs["worker"]
    assert set(gpu["devices"]) == {"/dev/kfd", "/dev/dri"} or {d.split(":")[0] for d in gpu["devices"]} == {
        "/dev/kfd", "/dev/dri"}
    assert "video" in gpu["group_add"] and gpu["ipc"] == "host"
    assert gpu["profiles"] == ["rocm"] and "devices" not in cpu  # a CPU host has no /dev/kfd
    assert argv(gpu["command"]) == argv(cpu["command"]) and gpu["depends_on"] == cpu["depends_on"]
    assert gpu["environment"]["TUNER_BACKEND"] == "aiter" and gpu["environment"]["TUNER_EXAMPLE_GFX"] == ""
    for svc in (gpu, cpu):  # the console script: `python -m workers` breaks where the cwd has its own `app`
        assert argv(svc["command"])[-1].rstrip().endswith("exec aiter-tuner-worker")


def checkout_copy(dest) -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for f in filter(None, files):
            if (ROOT / f).exists():
                tar.add(ROOT / f, arcname=f)
    buf.seek(0)
    with tarfile.open(fileobj=buf) as tar:
        tar.extractall(dest, filter="data")


def listing(folder) -> dict[str, float]:
    return {str(p.relative_to(folder)): p.stat().st_mtime for p in folder.rglob("*")}


class Stack:
    """The compose services as local processes: mounts mapped to folders, host names to loopback."""

    def __init__(self, tmp, port):
        self.tmp, self.port, self.procs = tmp, port, []
        self.src = tmp / "checkout"
        checkout_copy(self.src)
        self.hosts = {"service:8000": f"127.0.0.1:{port}", "vllm:8001": f"127.0.0.1:{installed.free_port()}",
                      "0.0.0.0": "127.0.0.1", "--port 8000": f"--port {port}",
                      "127.0.0.1:8000": f"127.0.0.1:{port}"}  # the service's own port, inside its container

    def mapped(self, name: str, text: str) -> str:
        for source, target, _ in mounts(services()[name]):
            folder = self.src if source == str(ROOT) else self.tmp / "volumes" / source
            folder.mkdir(parents=True, exist_ok=True)
            text = re.sub(re.escape(target) + r"(?=[/\s'\"]|$)", str(folder), text)
        for host, local in self.hosts.items():
            text = text.replace(host, local)
        return text

    def env(self, name: str, bin_) -> dict[str, str]:
        out = {k: self.mapped(name, unescaped(v)) for k, v in services()[name].get("environment", {}).items()}
        if "DATABASE_URL" in out:  # NEEDS_ENGINE["postgres"]
            out["DATABASE_URL"] = f"sqlite:///{self.tmp / 'tuner.db'}"
        return installed.env(bin_, **out)  # USER_ENV only filled the file's ${...} (compose's config)

    def start(self, name: str) -> subprocess.Popen:
        bin_ = installed.venv(self.tmp / f"venv-{name}")
        args = [self.mapped(name, a) for a in argv(services()[name]["command"])]
        assert args[:2] == ["sh", "-c"], args
        cwd = self.tmp / f"cwd-{name}"
        cwd.mkdir()
        log = (self.tmp / f"{name}.log").open("w")
        p = subprocess.Popen(args, cwd=cwd, env=self.env(name, bin_), stdout=log, stderr=subprocess.STDOUT)
        p.log, p.bin = self.tmp / f"{name}.log", bin_  # type: ignore[attr-defined]
        self.procs.append(p)
        return p

    def stop(self) -> None:
        for p in reversed(self.procs):
            installed.stop(p)


def wait(what, until, procs, timeout_s=600):
    end = time.monotonic() + timeout_s
    while not until():
        for p in procs:
            assert p.poll() is None, f"{what}: a process exited {p.returncode}:\n{p.log.read_text()[-4000:]}"
        assert time.monotonic() < end, f"{what}: not after {timeout_s} s"
        time.sleep(0.5)


@pytest.mark.timeout(1500)
def test_each_compose_service_command_runs_as_written(tmp_path):
    port = installed.free_port()
    url = f"http://127.0.0.1:{port}"
    stack = Stack(tmp_path, port)
    before = listing(stack.src)
    try:
        wheel = stack.start("wheel")
        assert wheel.wait(timeout=600) == 0, wheel.log.read_text()[-4000:]
        assert list((tmp_path / "volumes" / "wheels").glob("aiter_tuner-*.whl"))

        service = stack.start("service")
        installed.wait_healthy(url, service, service.log, timeout_s=600)
        check = argv(services()["service"]["healthcheck"]["test"])[1:]
        assert subprocess.run([str(service.bin / check[0]), *[stack.mapped("service", a) for a in check[1:]]],
                              timeout=60).returncode == 0
        secrets = tmp_path / "volumes" / "secrets"
        assert {p.name for p in secrets.iterdir()} == {"admin_token", "worker", "capture"}

        worker = stack.start("worker")  # posts the example capture as itself, then tunes it

        def tuned() -> bool:
            camps = httpx.get(f"{url}/v1/campaigns", timeout=30).json()
            return any(c["gfx"] == "cpu" and c["queued"] < c["shapes"] for c in camps)
        wait("the worker tunes the example capture", tuned, [service, worker])
        installed.stop(worker)

        log = tmp_path / "volumes" / "logs" / "vllm.log"  # NEEDS_ENGINE["vllm"]: its log, as it writes it
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(bf16_miss(7, 4096, 4096))
        capture = stack.start("capture")

        def captured() -> bool:
            return any(c["gfx"] == "gfx942" for c in httpx.get(f"{url}/v1/campaigns", timeout=30).json())
        wait("the capture sidecar posts the server's miss", captured, [service, capture])
        installed.stop(capture)
        assert capture.returncode == 0, capture.log.read_text()[-4000:]
    finally:
        stack.stop()
    assert listing(stack.src) == before, "nothing is written into the read-only checkout mount"
