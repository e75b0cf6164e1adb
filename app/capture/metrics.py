"""vLLM's tokens-per-step histogram (`vllm:iteration_tokens_total`) from its Prometheus endpoint, as step counts
per bucket since the last reading, and its request length histograms (`vllm:request_prompt_tokens`,
`vllm:request_generation_tokens`: finished requests per length bucket), which give the serving A/B its default
input and output lengths. prometheus_client's parser where it is installed (vLLM images have it), else a small one
for the lines needed."""

from __future__ import annotations

import logging
import math
import re

log = logging.getLogger("aiter-tuner.capture")

HISTOGRAM = "vllm:iteration_tokens_total"
LENGTHS = {"prompt": "vllm:request_prompt_tokens", "generation": "vllm:request_generation_tokens"}
# a bucket's count is a step counter: a float that counts exactly up to 2^53; NaN, Inf, a negative or a bigger
# value is a broken exporter, skipped (the service takes at most 2^62 steps a bucket, app/schemas.py)
MAX_COUNT = float(2**53)
_BUCKET = r"^{}_bucket\{{(?P<labels>[^}}]*)\}}\s+(?P<value>\S+)"
_LE = re.compile(r'(?:^|,)\s*le="(?P<le>[^"]+)"')


def _le_key(le: str) -> str:
    v = float(le)
    return "+Inf" if math.isinf(v) else (str(int(v)) if v.is_integer() else repr(v))


def _samples_small(text: str, name: str) -> list[tuple[str, float]]:
    out = []
    bucket = re.compile(_BUCKET.format(re.escape(name)))
    for line in text.splitlines():
        m = bucket.match(line)
        if m:
            le = _LE.search(m.group("labels"))
            if le:
                out.append((le.group("le"), float(m.group("value"))))
    return out


def _samples_prometheus(text: str, name: str) -> list[tuple[str, float]]:
    from prometheus_client.parser import text_string_to_metric_families
    return [(s.labels["le"], float(s.value)) for fam in text_string_to_metric_families(text) for s in fam.samples
            if s.name == name + "_bucket" and "le" in s.labels]


def cumulative(text: str, name: str = HISTOGRAM) -> dict[str, float]:
    """Counts at or under each bucket bound of histogram `name` (steps, or finished requests for a length
    histogram), summed over engines and models (label sets)."""
    try:
        samples = _samples_prometheus(text, name)
    except ImportError:
        samples = _samples_small(text, name)
    out: dict[str, float] = {}
    bad = []
    for le, v in samples:
        try:
            key = _le_key(le)
        except (ValueError, OverflowError):
            key = "nan"
        if key == "nan" or not 0 <= v <= MAX_COUNT:  # NaN fails the comparison too
            bad.append(f"le={le!r} {v!r}")
            continue
        out[key] = min(out.get(key, 0.0) + v, MAX_COUNT)
    if bad:  # skipped, never fatal: the same page is read again after every restart
        log.warning("metrics: %d %s bucket(s) skipped, not a count in 0..2^53 (%s)", len(bad), name,
                    ", ".join(bad[:3]))
    return out


def _order(cum: dict[str, float]) -> list[str]:
    return sorted(cum, key=lambda k: float(k))


def delta(cur: dict[str, float], prev: dict[str, float] | None) -> dict[str, int]:
    """Steps per bucket (not cumulative) since prev; a server restart (counts went down) counts from zero."""
    prev = prev or {}
    if any(cur.get(k, 0.0) < v for k, v in prev.items()):
        prev = {}
    out, below = {}, 0.0
    for k in _order(cur):
        d = cur[k] - prev.get(k, 0.0)
        out[k] = int(round(d - below))
        below = d
    return {k: v for k, v in out.items() if v > 0}
