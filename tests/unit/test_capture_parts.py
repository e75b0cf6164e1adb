"""Capture agent parts: vLLM's histogram read two ways, AITER's identity rules, the log follower."""

from __future__ import annotations

import builtins
import os

import pytest

from app.capture import identity, metrics
from app.capture.tail import FileFollower, Position
from tests.e2e.test_capture_agent import vllm_metrics

HIST = {"1": 900, "8": 51, "16": 20, "8192": 3, "+Inf": 1}


@pytest.fixture(params=["prometheus_client", "small"])
def parser(request, monkeypatch):
    if request.param == "small":
        real = builtins.__import__

        def no_prom(name, *a, **kw):
            if name.startswith("prometheus_client"):
                raise ImportError(name)
            return real(name, *a, **kw)
        monkeypatch.setattr(builtins, "__import__", no_prom)
    return request.param


def test_histogram_buckets_summed_over_engines_then_per_bucket_deltas(parser):
    cum = metrics.cumulative(vllm_metrics(HIST))
    assert cum["1"] == 900 and cum["8"] == 951 and cum["+Inf"] == 975 and set(cum) >= {"32", "4096"}
    assert metrics.delta(cum, None) == HIST
    later = metrics.cumulative(vllm_metrics({k: 2 * v for k, v in HIST.items()}))
    assert metrics.delta(later, cum) == HIST
    restarted = metrics.cumulative(vllm_metrics({"1": 5}))
    assert metrics.delta(restarted, cum) == {"1": 5}  # counters went down: the server restarted


ROCMINFO = """*******
Agent 1
*******
  Name:                    AMD EPYC 9654 96-Core Processor
  Compute Unit:            192
  Device Type:             CPU
*******
Agent 2
*******
  Name:                    gfx942
  Marketing Name:          AMD Instinct MI300X
  Compute Unit:            304
  Device Type:             GPU
*******
Agent 3
*******
  Name:                    gfx942
  Compute Unit:            304
  Device Type:             GPU
"""


def test_identity_is_the_gpu_and_gpu_archs_cu_num_go_along_as_the_serving_environment():
    """The campaign is the GPU (get_gfx_runtime, the compiled tables' device query); GPU_ARCHS and CU_NUM are
    sent beside it, so the service predicts what get_gfx()/get_cu_num() make of them (lookup_identity)."""
    assert identity.gfx_from({}, ROCMINFO) == "gfx942" and identity.cu_num_from({}, ROCMINFO) == 304
    served = {"GPU_ARCHS": "gfx942;gfx950", "CU_NUM": "80", "PATH": "/bin"}
    assert identity.gfx_from(served, ROCMINFO) == "gfx942" and identity.cu_num_from(served, ROCMINFO) == 304
    assert identity.serving_env(served) == {"GPU_ARCHS": "gfx942;gfx950", "CU_NUM": "80"}
    assert identity.serving_env({"PATH": "/bin"}) == {}
    # issue 35: and the variables AITER's MoE op derives its activation dtype from (fused_moe.py:76, 768, 776-803)
    moe = {"AITER_BF16_FP8_MOE_BOUND": "64", "AITER_SITUV2_A8W4": "1", "AITER_FORCE_A8W4": ""}
    assert identity.serving_env(dict(served, **moe)) == {"GPU_ARCHS": "gfx942;gfx950", "CU_NUM": "80", **moe}
    # no rocminfo: GPU_ARCHS' last entry and CU_NUM stand in for the GPU
    assert identity.gfx_from(served, None) == "gfx950" and identity.cu_num_from(served, None) == 80
    assert identity.cu_num_from({}, ROCMINFO.replace("304", "256", 1)) is None  # mixed GPUs: AITER asserts
    assert identity.cu_num_from({"CU_NUM": "80"}, ROCMINFO.replace("304", "256", 1)) is None
    assert identity.gfx_from({}, None) is None


def test_follower_keeps_partial_lines_and_sees_truncation_by_content(tmp_path):
    log = tmp_path / "s.log"
    log.write_text("a\nb\npartial")
    f = FileFollower(str(log))
    assert f.read() == ["a", "b"] and f.pos.offset == 4
    with open(log, "a") as fh:
        fh.write(" line\n")
    assert f.read() == ["partial line"]
    pos = Position(f.pos.inode, f.pos.offset, f.pos.head)
    f.close()
    log.write_text("x" * 14 + "\n")  # truncated and refilled past the old offset
    g = FileFollower(str(log), pos)
    assert g.read() == ["x" * 14] and g.notes
    os.rename(log, tmp_path / "s.log.1")
    log.write_text("new\n")
    with open(tmp_path / "s.log.1", "a") as fh:
        fh.write("late\n")
    assert g.read() == ["late", "new"]


def test_the_agent_tests_bf16_line_is_aiters_own_fstring(aiter_src_dir):
    """tests/e2e/test_capture_agent.py writes bf16 miss lines; they must render as tuned_gemm.py's f-string does."""
    import ast
    import types

    from tests.e2e.test_capture_agent import F, bf16_miss
    src = (aiter_src_dir / "aiter" / "tuned_gemm.py").read_text()
    (line,) = [ln.strip() for ln in src.splitlines() if "not found tuned config in {AITER_CONFIGS" in ln]
    fstring = ast.parse(line, mode="eval").body
    M, N, K, bias, scaleAB, bpreshuffle = 4096, 8192, 8192, False, False, False
    dtype = otype = "torch.bfloat16"
    AITER_CONFIGS = types.SimpleNamespace(AITER_CONFIG_GEMM_BF16_FILE=F)  # noqa: N806, F841
    default_config = {"libtype": "torch", "solidx": 0}  # noqa: F841
    rendered = eval(compile(ast.Expression(fstring), "tuned_gemm.py", "eval"))  # AITER's own f-string
    assert bf16_miss(M, N, K) == "[aiter] " + rendered + "\n"
