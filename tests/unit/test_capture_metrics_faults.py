"""A broken /metrics page (NaN, Inf, huge or negative bucket counts, a bound that is no number) is skipped with a
warning, never a crash of the capture agent (which reads the same page again after every restart)."""

from __future__ import annotations

import logging

from app.schemas import CaptureIn
from app.capture import metrics
from tests.conftest import DIGEST
from tests.e2e.test_capture_agent import vllm_metrics
from tests.unit.test_capture_parts import HIST, parser  # noqa: F401 - fixture: both parsers

BROKEN = ['vllm:iteration_tokens_total_bucket{engine="9",le="1.0",model_name="m"} NaN',
          'vllm:iteration_tokens_total_bucket{engine="9",le="8.0",model_name="m"} +Inf',
          'vllm:iteration_tokens_total_bucket{engine="9",le="16.0",model_name="m"} 1e300',
          'vllm:iteration_tokens_total_bucket{engine="9",le="32.0",model_name="m"} -5',
          'vllm:iteration_tokens_total_bucket{engine="9",le="NaN",model_name="m"} 3']


def test_bad_bucket_values_are_skipped_with_a_warning(parser, caplog):
    text = vllm_metrics(HIST).replace("# TYPE vllm:num_requests_running", "\n".join(BROKEN) +
                                      "\n# TYPE vllm:num_requests_running")
    with caplog.at_level(logging.WARNING, "aiter-tuner.capture"):
        cum = metrics.cumulative(text)
    assert cum == metrics.cumulative(vllm_metrics(HIST)) and "5 vllm:iteration_tokens_total bucket(s) skipped" in caplog.text
    steps = metrics.delta(cum, None)
    assert steps == HIST
    CaptureIn(image_digest=DIGEST, gfx="gfx942", cu_num=304, family="bf16_gemm", shapes=[], step_buckets=steps)
