"""Log parsing is linear: 8 MB of hostile AITER-looking text parses in under a second of CPU (it used to be
quadratic on fused_moe lines: a 320 KB log took ~14 s). Each case runs in a child with a hard timeout, so a
regression fails fast instead of hanging the suite. The child's CPU time is what is bounded, not the wall
clock: on a loaded 2-core CI machine the wall time of a 0.25 s parse went past 1 s (five busy loops beside it)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

MB8 = 8 * 1024 * 1024
CASES = {
    "fmoe markers on one line": "[fused_moe] using 1stage (kernelName1=",
    "fmoe unterminated keys": "[fused_moe] using 2stage (kernelName1='k') for (",
    "fmoe markers, many lines": "[fused_moe] using 1stage (kernelName1=" * 50 + "\n",
    "gemm miss lines without an end": "shape is M:1, N:1, K:1 dtype=x otype=y bias=z, scaleAB=w, bpreshuffle=v, "
                                      "not found tuned config in ",
    "a8w8 hit lines without an end": "shape M:1, N:2, K:3 q_dtype_w:torch.int8, found padded_M: 1, N:2, K:3 is tuned, in ",
    "batched hit lines without an end": "shape is B:1, M:1, N:1, K:1 dtype is bf16, is tuned on cu_num = 1 in ",
}
CHILD = """
import json, sys, time
from app.domain.log_lines import parse_log
unit = sys.stdin.read()
text = (unit * ({n} // len(unit) + 1))[:{n}]
t = time.process_time(); parse_log(text); print(json.dumps(time.process_time() - t))
"""


@pytest.mark.parametrize("unit", list(CASES.values()), ids=list(CASES))
def test_an_8mb_hostile_log_parses_in_under_a_second(unit):
    try:
        out = subprocess.run([sys.executable, "-c", CHILD.format(n=MB8)], input=unit, cwd=ROOT, text=True,
                             capture_output=True, timeout=30, check=True)
    except subprocess.TimeoutExpired:
        pytest.fail("parsing 8 MB took over 30 s: quadratic again")
    took = json.loads(out.stdout)
    print(f"8 MB of {unit[:30]!r}...: {took:.3f} s of CPU")
    assert took < 1.0
