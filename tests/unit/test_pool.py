"""Pool manager: the container spec docker builds for a ROCm GPU worker, and start/list/stop by label."""

from __future__ import annotations

from docker.models.containers import _create_container_args

import pytest

from workers.pool import (BOOTSTRAP, LABEL, TOKEN_PATH, WHEELS, PoolConfig, PoolManager, container_kwargs,
                          kfd_render_minors, resolve_digest)
from workers.settings import WorkerSettings

DIGEST = "sha256:" + "a" * 64
SECRET = "atk_secret-worker-token"


@pytest.fixture(autouse=True)
def _files(tmp_path_factory, monkeypatch):
    """A wheelhouse with this project's wheel and a token file, as `pool start` needs them (the working dir)."""
    d = tmp_path_factory.mktemp("pool")
    monkeypatch.chdir(d)
    (d / "wheels").mkdir()
    (d / "wheels" / "aiter_tuner-0.1.0-py3-none-any.whl").write_bytes(b"")
    (d / "token").write_text(SECRET + "\n")
    return d


def cfg(**kw):
    kw = {"wheelhouse": "wheels", "token_file": "token", **kw}
    return PoolConfig("p1", "rocm/vllm:rocm7", "http://svc:8000", [0, 1], render_minors={0: 128, 1: 136},
                      group_ids=[44, 993], **kw)


def test_docker_builds_the_rocm_host_config_offline():
    kw = dict(container_kwargs(cfg(), 1, DIGEST), version="1.45")
    kw.pop("detach")
    hc = _create_container_args(kw)["host_config"]
    assert [d["PathOnHost"] for d in hc["Devices"]] == ["/dev/kfd", "/dev/dri/renderD136"]
    assert hc["GroupAdd"] == ["44", "993"] and hc["IpcMode"] == "host" and hc["ShmSize"] == 16 * 2 ** 30
    assert hc["SecurityOpt"] == ["seccomp=unconfined"]
    env = container_kwargs(cfg(), 1, DIGEST)["environment"]
    assert env["TUNER_IMAGE_DIGEST"] == DIGEST and env["TUNER_GPU"] == "0" and env["TUNER_WORKER_ID"] == "p1-gpu1"


def test_the_token_is_a_read_only_file_never_on_a_command_line_or_in_the_environment(_files):
    tmp_path = _files
    kw = container_kwargs(cfg(), 0, DIGEST)
    assert kw["volumes"][str(tmp_path / "token")] == {"bind": TOKEN_PATH, "mode": "ro"}
    env = kw["environment"]
    assert env["TUNER_TOKEN_FILE"] == TOKEN_PATH and "TUNER_TOKEN" not in env
    assert SECRET not in repr(kw), "the secret itself goes nowhere but the mounted file"
    assert WorkerSettings.load({}, {**env, "TUNER_TOKEN_FILE": str(tmp_path / "token")}).resolved_token() == SECRET


def test_the_wheel_is_installed_into_a_venv_over_the_image_then_the_console_script_runs(_files):
    tmp_path = _files
    kw = container_kwargs(cfg(), 0, DIGEST)
    assert kw["command"] == ["python3", "-c", BOOTSTRAP]
    assert kw["volumes"][str(tmp_path / "wheels")] == {"bind": WHEELS, "mode": "ro"}
    assert "PYTHONPATH" not in kw["environment"] and not any("/opt/aiter-tuner\"" in v for v in kw["volumes"])
    # the image's site-packages stay visible (its torch, aiter); the wheels only, from the mount, no index
    assert "system_site_packages=True" in BOOTSTRAP and '"--no-deps", "--no-index"' in BOOTSTRAP
    assert '"aiter-tuner-worker"' in BOOTSTRAP and "os.execv(exe" in BOOTSTRAP and "-m workers" not in BOOTSTRAP
    compile(BOOTSTRAP, "bootstrap", "exec")


def test_restarts_are_bounded_and_zero_means_none():
    assert container_kwargs(cfg(), 0, DIGEST)["restart_policy"] == {"Name": "on-failure", "MaximumRetryCount": 3}
    assert container_kwargs(cfg(restart_retries=0), 0, DIGEST)["restart_policy"] == {"Name": "no"}  # not unlimited


def test_without_gpu_devices_the_pool_runs_on_the_cpu():
    kw = container_kwargs(cfg(cpu_only=True), 1, DIGEST)
    assert kw["devices"] == [] and kw["group_add"] == [] and kw["environment"]["TUNER_GPU"] == "0"


def test_start_refuses_a_missing_wheel_or_token_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no aiter_tuner wheel"):
        PoolManager(FakeDocker()).start(cfg(wheelhouse=str(tmp_path / "none")))
    with pytest.raises(FileNotFoundError, match="token file"):
        PoolManager(FakeDocker()).start(cfg(token_file=str(tmp_path / "absent")))


def test_without_a_render_node_the_gpu_is_pinned_by_visibility():
    kw = container_kwargs(cfg(pin_render_node=False), 1, DIGEST)
    assert kw["devices"] == ["/dev/kfd", "/dev/dri"]
    assert kw["environment"]["HIP_VISIBLE_DEVICES"] == "1"


def test_digest_comes_from_repo_digests():
    attrs = {"Id": "sha256:" + "c" * 64, "RepoDigests": ["other/x@sha256:" + "b" * 64, "rocm/vllm@" + DIGEST]}
    assert resolve_digest(attrs, "rocm/vllm:rocm7") == DIGEST
    assert resolve_digest({"Id": "sha256:" + "c" * 64, "RepoDigests": []}, "local:dev") == "sha256:" + "c" * 64


def test_references_are_matched_as_docker_normalises_them():
    other = "sha256:" + "e" * 64
    attrs = {"Id": "x", "RepoDigests": ["localhost:5000/rocm/vllm@" + other, "rocm/vllm@" + DIGEST]}
    for ref in ("docker.io/rocm/vllm:rocm7", "rocm/vllm:rocm7@" + DIGEST, "index.docker.io/rocm/vllm"):
        assert resolve_digest(attrs, ref) == DIGEST, ref
    assert resolve_digest(attrs, "localhost:5000/rocm/vllm:dev") == other


def test_kfd_topology_maps_gpu_index_to_render_node(tmp_path):
    for node, props in {"0": "simd_count 0\ndrm_render_minor 0", "1": "simd_count 1216\ndrm_render_minor 128",
                        "2": "simd_count 1216\ndrm_render_minor 136"}.items():
        (tmp_path / node).mkdir()
        (tmp_path / node / "properties").write_text(props)
    assert kfd_render_minors(str(tmp_path)) == {0: 128, 1: 136}


class FakeContainer:
    def __init__(self, cid, kw):
        self.id, self.name, self.labels, self.status, self.stopped = cid, kw["name"], kw["labels"], "running", None

    def stop(self, timeout):
        self.stopped = timeout

    def remove(self, force=False):
        self.status = "removed"


class FakeDocker:
    """The docker SDK's surface the manager uses (tests/e2e/test_docker_pool.py runs it on a real engine)."""

    def __init__(self):
        self.runs = []
        outer = self

        class Images:
            def get(self, ref):
                class I:
                    attrs = {"Id": "sha256:" + "c" * 64, "RepoDigests": ["rocm/vllm@" + DIGEST]}
                return I()

        class Containers:
            def run(self, **kw):
                c = FakeContainer(f"c{len(outer.runs)}", kw)
                outer.runs.append((kw, c))
                return c

            def list(self, all, filters):
                want = filters["label"].split("=", 1)[1]
                return [c for _, c in outer.runs if c.labels[LABEL] == want and c.status != "removed"]

        self.images, self.containers = Images(), Containers()


def test_start_list_stop_one_container_per_gpu():
    fake = FakeDocker()
    mgr = PoolManager(fake)
    assert mgr.start(cfg()) == ["c0", "c1"]
    assert {kw["environment"]["TUNER_IMAGE_DIGEST"] for kw, _ in fake.runs} == {DIGEST}
    assert [x["gpu"] for x in mgr.list("p1")] == ["0", "1"]
    assert mgr.stop("p1", timeout_s=30) == 2
    assert all(c.stopped == 30 for _, c in fake.runs) and mgr.list("p1") == []
