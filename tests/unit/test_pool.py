"""Pool manager: the container spec docker builds for a ROCm GPU worker, and start/list/stop by label."""

from __future__ import annotations

from docker.models.containers import _create_container_args

from workers.pool import LABEL, PoolConfig, PoolManager, container_kwargs, kfd_render_minors, resolve_digest

DIGEST = "sha256:" + "a" * 64


def cfg(**kw):
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

    def remove(self):
        self.status = "removed"


class FakeDocker:
    """The docker SDK's surface the manager uses; there is no Docker engine on this machine."""

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
