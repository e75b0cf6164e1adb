"""docker-compose.yml's commands, run as written against this checkout's wheel, without a Docker engine.

Each service's `command` (its shell line after compose's interpolation) and `environment` run in a venv of its
own (installed.venv: the image's Python, seeing the tested packages), with each volume's mount point mapped to
a temp folder, the checkout's mount to a copy of it, and the other services' host names to loopback. What
needs an engine and is not run here: the postgres image (the service runs on SQLite instead) and the vllm
image (a ROCm GPU and a model; its log is written by the test). `docker compose config` checks the file where
the compose plugin is installed."""

from __future__ import annotations

import io
import re
import shlex
import subprocess
import tarfile
import time

import httpx
import pytest
import yaml

from tests.conftest import ROOT
from tests.e2e import installed
from tests.e2e.test_capture_agent import bf16_miss

pytestmark = pytest.mark.e2e
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
NEEDS_ENGINE = {"postgres": "the postgres:16 image (here the service runs on SQLite)",
                "vllm": "a ROCm GPU, the vLLM image and a model (here the test writes the server's log)"}
# what a user's .env says on a host where the capture agent has no rocminfo
USER_ENV = {"TUNER_GFX": "gfx942", "TUNER_CU_NUM": "304"}
VAR = re.compile(r"\$(?:(\$)|\{(\w+)(?:(:?[-?])([^}]*))?\}|(\w+))")


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's interpolation: $$ is a literal $, ${V:-d} d when V is unset or empty, ${V-d} when unset."""
    def one(m: re.Match) -> str:
        if m.group(1):
            return "$"
        name = m.group(2) or m.group(5)
        op, default = m.group(3), m.group(4) or ""
        value = env.get(name)
        if op == ":-" and not value or op == "-" and value is None:
            return default
        assert op not in (":?", "?") or value, f"{name} must be set: {default}"
        return value or ""
    return VAR.sub(one, text)


def test_the_compose_file_is_consistent():
    assert set(SERVICES) - set(NEEDS_ENGINE) == {"wheel", "service", "worker", "capture"}
    for name, svc in SERVICES.items():
        assert "image" in svc and ("command" in svc or name in NEEDS_ENGINE), name
        for dep in svc.get("depends_on", {}):
            assert dep in SERVICES, (name, dep)
        for vol in svc.get("volumes", []):
            source = vol.split(":", 1)[0]
            assert source == "." or source in COMPOSE["volumes"], (name, vol)
            if source == ".":
                assert vol.endswith(":ro"), "the checkout is mounted read-only"
        # every variable the shell should see is escaped ($$), every compose variable has a default
        for m in VAR.finditer(str(svc.get("command", "")) + str(svc.get("environment", {}))):
            assert m.group(1) or m.group(3), (name, m.group(0))
        assert "install -q aiter-tuner" not in str(svc.get("command")), "never a package index's aiter-tuner"
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        p = subprocess.run(["docker", "compose", "config", "-q"], cwd=ROOT, capture_output=True, text=True)
        assert p.returncode == 0, p.stderr


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
        for vol in SERVICES[name].get("volumes", []):
            source, target = vol.split(":")[:2]
            folder = self.src if source == "." else self.tmp / "volumes" / source
            folder.mkdir(parents=True, exist_ok=True)
            text = re.sub(re.escape(target) + r"(?=[/\s'\"]|$)", str(folder), text)
        for host, local in self.hosts.items():
            text = text.replace(host, local)
        return text

    def env(self, name: str, bin_) -> dict[str, str]:
        out = {k: self.mapped(name, interpolate(str(v), USER_ENV))
               for k, v in SERVICES[name].get("environment", {}).items()}
        if "DATABASE_URL" in out:  # NEEDS_ENGINE["postgres"]
            out["DATABASE_URL"] = f"sqlite:///{self.tmp / 'tuner.db'}"
        return installed.env(bin_, **out)  # USER_ENV only fills the file's ${...}, as compose does

    def start(self, name: str) -> subprocess.Popen:
        bin_ = installed.venv(self.tmp / f"venv-{name}")
        argv = shlex.split(self.mapped(name, interpolate(SERVICES[name]["command"], USER_ENV)))
        assert argv[:2] == ["sh", "-c"], argv
        cwd = self.tmp / f"cwd-{name}"
        cwd.mkdir()
        log = (self.tmp / f"{name}.log").open("w")
        p = subprocess.Popen(argv, cwd=cwd, env=self.env(name, bin_), stdout=log, stderr=subprocess.STDOUT)
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
        check = SERVICES["service"]["healthcheck"]["test"][1:]
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
