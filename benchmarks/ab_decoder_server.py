"""A minimal OpenAI-compatible streaming server over a small Llama-shaped decoder with random bf16 weights, for the
serving A/B on a GPU (issue 32, benchmarks/ab_h200.py). Its linear layers take each call's kernel from the torch
backend's overlay, found as AITER finds a row, or plain F.linear where none is found (or with no overlay):

    AITER_CONFIG_GEMM_BF16=overlay.csv python benchmarks/ab_decoder_server.py --port P --log-file F [--device cuda:0]

An overlay row (the torch backend's, workers/backends/torch_race.py) names a kernel in `kernelName`: torch_linear
(F.linear), torch_mm_bt_contig (x @ W^T stored K x N), torch_splitk{2,4}_fp32acc (split-K, fp32 partials) or a
Triton config triton_gemm_{BM}x{BN}x{BK}_sk{S}_w{W}_s{ST} (workers/backends/triton_gemm.py: M is not specialised, so a
row tuned at a padded M runs any M it serves). A call with M rows tries AITER's M candidates (raw M, getPaddedM gl0,
gl1: app.domain.keys.m_candidates, tuned_gemm.py:145-160) at this server's gfx/cu_num, N, K, bias False, bf16 in
and out, and logs AITER's hit (tuned_gemm.py:183) or miss (:232) line once per shape, as AITER does, to F.rank0.

The engine: a thread runs continuous batching (one prompt's prefill, eager, between decode steps; a decode step
for every running request, replayed from a CUDA graph captured per batch size at start, as vLLM does), greedy
tokens and their logprobs; the asyncio HTTP front end (stdlib only: the GPU image has no web framework) streams
each token as a server-sent event. Prompts: one token per whitespace word (its hash mod the vocabulary). Decoder:
RMSNorm, fused QKV (GQA), SDPA over a per-slot KV cache, output projection, fused gate/up with SiLU, down, and an
LM head through F.linear in every arm (not in the overlay); no rotary embedding (it changes no GEMM).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import queue
import sys
import threading
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from app.domain.families import FAMILIES  # noqa: E402
from app.domain.keys import m_candidates  # noqa: E402

FAMILY = FAMILIES["bf16_gemm"]
BF16 = "torch.bfloat16"


# ---- kernels -----------------------------------------------------------------------------------------------------

def kernel_fn(name: str, w: torch.Tensor):
    """x [M, K] -> x @ w.T [M, N] by the named kernel of the torch backend."""
    if name == "torch_linear":
        return lambda x: F.linear(x, w)
    if name == "torch_mm_bt_contig":
        wt = w.t().contiguous()
        return lambda x: x @ wt
    if name.startswith("torch_splitk"):
        parts = int(name[len("torch_splitk"):].split("_")[0])
        k = w.shape[1]
        bounds = [round(i * k / parts) for i in range(parts + 1)]

        def split(x: torch.Tensor) -> torch.Tensor:
            acc = torch.zeros(x.shape[0], w.shape[0], dtype=torch.float32, device=x.device)
            for lo, hi in zip(bounds, bounds[1:]):
                acc += (x[:, lo:hi] @ w[:, lo:hi].t()).float()
            return acc.to(w.dtype)
        return split
    if name.startswith("triton_gemm_"):
        import triton

        from workers.backends.triton_configs import CONFIGS, config_name
        from workers.backends.triton_gemm import _gemm_kernel
        cfg = {config_name(c): c for c in CONFIGS}[name]
        bm, bn, bk, sk, warps, stages = cfg
        n, k = w.shape
        k_per = triton.cdiv(triton.cdiv(k, sk), bk) * bk

        def tri(x: torch.Tensor) -> torch.Tensor:
            m = x.shape[0]
            buf = torch.empty((sk, m, n), device=x.device, dtype=torch.float32 if sk > 1 else w.dtype)
            grid = (triton.cdiv(m, bm), triton.cdiv(n, bn), sk)
            _gemm_kernel[grid](x, w, buf, x, m, n, k, k_per, x.stride(0), x.stride(1), w.stride(0), w.stride(1),
                               buf.stride(0), buf.stride(1), buf.stride(2), HAS_BIAS=False, BLOCK_M=bm, BLOCK_N=bn,
                               BLOCK_K=bk, SPLIT_K=sk, num_warps=warps, num_stages=stages)
            return buf[0] if sk == 1 else buf.sum(0).to(w.dtype)
        return tri
    raise KeyError(f"unknown kernel {name!r}")


class Overlay:
    """The bf16 rows AITER_CONFIG_GEMM_BF16 names (one path or several, os.pathsep-joined), keyed as AITER keys them
    (the bias/dtype cells this decoder calls with)."""

    def __init__(self, env_value: str | None, gfx: str, cu_num: int, log):
        self.rows: dict[tuple[int, int, int], dict[str, str]] = {}
        self.file = env_value or "/opt/aiter/aiter/configs/bf16_tuned_gemm.csv"
        self.log = log
        for p in (env_value or "").split(os.pathsep):
            if p and os.path.exists(p):
                with open(p, newline="") as fh:
                    for r in csv.DictReader(fh):
                        if (r.get("gfx", gfx) == gfx and int(r["cu_num"]) == cu_num and r["bias"] == "False"
                                and r["dtype"] == BF16 and r["outdtype"] == BF16 and r["scaleAB"] == "False"
                                and r["bpreshuffle"] == "False"):
                            self.rows[(int(r["M"]), int(r["N"]), int(r["K"]))] = r
        self.cu_num = cu_num

    def find(self, m: int, n: int, k: int) -> str:
        head = (f"shape is M:{m}, N:{n}, K:{k} dtype='{BF16}' otype='{BF16}' bias=False, scaleAB=False, "
                "bpreshuffle=False")
        for pm in m_candidates(FAMILY, {"M": str(m), "N": str(n), "K": str(k)}):
            r = self.rows.get((pm, n, k))
            if r is not None:
                self.log(f"{head} found padded_M: {pm}, N:{n}, K:{k} is tuned on cu_num = {self.cu_num} in "
                         f"{self.file}, libtype is {r['libtype']}, kernel name is {r['kernelName']}")
                return r["kernelName"]
        self.log(f"{head}, not found tuned config in {self.file}, will use default config! using torch solution:0")
        return "torch_linear"


class Linear:
    def __init__(self, w: torch.Tensor, overlay: Overlay | None):
        self.w, self.overlay = w, overlay
        self.by_m: dict[int, object] = {}

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        m = x.shape[0]
        fn = self.by_m.get(m)
        if fn is None:
            name = self.overlay.find(m, *self.w.shape) if self.overlay else "torch_linear"
            fn = self.by_m[m] = kernel_fn(name, self.w)
        return fn(x)  # type: ignore[operator]


# ---- the decoder -------------------------------------------------------------------------------------------------

class Decoder:
    def __init__(self, a: argparse.Namespace, overlay: Overlay | None):
        dev, dt = torch.device(a.device), torch.bfloat16
        g = torch.Generator(device=dev).manual_seed(a.seed)  # on the device: every arm gets the same weights
        self.h, self.nh, self.nkv, self.d = a.hidden, a.heads, a.kv_heads, a.hidden // a.heads
        self.dev, self.ctx = dev, a.max_ctx

        def w(n: int, k: int) -> torch.Tensor:  # random, variance-preserving
            return (torch.randn(n, k, generator=g, device=dev) / k ** 0.5).to(dt)
        self.emb = torch.randn(a.vocab, a.hidden, generator=g, device=dev).to(dt)
        self.layers = []
        for _ in range(a.layers):
            self.layers.append({
                "qkv": Linear(w(a.hidden + 2 * a.kv_heads * self.d, a.hidden), overlay),
                "o": Linear(w(a.hidden, a.hidden), overlay),
                "gate_up": Linear(w(2 * a.inter, a.hidden), overlay),
                "down": Linear(w(a.hidden, a.inter), overlay),
                "n1": torch.ones(a.hidden, device=dev, dtype=dt), "n2": torch.ones(a.hidden, device=dev, dtype=dt),
                # [slot * ctx + position, kv head, d]: written with index_copy_ (capturable in a CUDA graph)
                "kc": torch.zeros(a.max_batch * a.max_ctx, a.kv_heads, self.d, device=dev, dtype=dt),
                "vc": torch.zeros(a.max_batch * a.max_ctx, a.kv_heads, self.d, device=dev, dtype=dt)})
        self.nf = torch.ones(a.hidden, device=dev, dtype=dt)
        self.lm_head = w(a.vocab, a.hidden)
        self.ar = torch.arange(a.max_ctx, device=dev)

    @staticmethod
    def rms(x: torch.Tensor, wt: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * wt

    @torch.no_grad()
    def forward(self, tok: torch.Tensor, pos: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """tok [b, T] from positions pos [b] on in cache slots [b] -> the greedy next token of each and its logprob."""
        b, t = tok.shape
        h, nh, nkv, d = self.h, self.nh, self.nkv, self.d
        x = self.emb[tok]
        qpos = pos[:, None] + self.ar[:t][None]
        mask = (self.ar[None, None, :] <= qpos[:, :, None])[:, None]  # [b, 1, T, ctx]
        flat = (slots[:, None] * self.ctx + qpos).reshape(-1)
        for L in self.layers:
            y = self.rms(x, L["n1"]).reshape(b * t, h)
            q, k, v = L["qkv"](y).view(b, t, -1).split([h, nkv * d, nkv * d], dim=-1)
            L["kc"].index_copy_(0, flat, k.reshape(b * t, nkv, d))
            L["vc"].index_copy_(0, flat, v.reshape(b * t, nkv, d))
            kk = L["kc"].view(-1, self.ctx, nkv, d)[slots].transpose(1, 2)  # [b, kv heads, ctx, d]
            vv = L["vc"].view(-1, self.ctx, nkv, d)[slots].transpose(1, 2)
            att = F.scaled_dot_product_attention(q.reshape(b, t, nh, d).transpose(1, 2), kk, vv, attn_mask=mask,
                                                 enable_gqa=True)
            x = x + L["o"](att.transpose(1, 2).reshape(b * t, h)).view(b, t, h)
            gu = L["gate_up"](self.rms(x, L["n2"]).reshape(b * t, h))
            gate, up = gu.chunk(2, dim=-1)
            x = x + L["down"]((F.silu(gate) * up).contiguous()).view(b, t, h)
        logits = F.linear(self.rms(x[:, -1], self.nf), self.lm_head).float()
        val, idx = logits.log_softmax(-1).max(-1)
        return idx, val


# ---- the engine --------------------------------------------------------------------------------------------------

class Req:
    def __init__(self, prompt: list[int], max_tokens: int, loop: asyncio.AbstractEventLoop):
        self.prompt, self.max_tokens, self.loop = prompt, max_tokens, loop
        self.q: asyncio.Queue = asyncio.Queue()
        self.slot = self.pos = self.produced = self.last = 0

    def emit(self, item) -> None:
        self.loop.call_soon_threadsafe(self.q.put_nowait, item)


class Engine:
    def __init__(self, a: argparse.Namespace, model: Decoder):
        self.a, self.m = a, model
        self.pending: queue.Queue[Req] = queue.Queue()
        self.running = 0
        self.steps: dict[int, int] = {}  # batch size -> decode steps (vllm:iteration_tokens_total)
        dev = model.dev
        self.tok = torch.zeros(a.max_batch, 1, dtype=torch.long, device=dev)
        self.pos = torch.zeros(a.max_batch, dtype=torch.long, device=dev)
        self.slots = torch.arange(a.max_batch, dtype=torch.long, device=dev)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        if dev.type == "cuda" and a.graphs:
            try:
                self._capture(a, model)
            except Exception as e:  # eager decode still serves; the log says why it is slower
                self.graphs.clear()
                self.capture_error = f"{type(e).__name__}: {e}"[:500]

    capture_error = ""

    def _capture(self, a: argparse.Namespace, model: Decoder) -> None:
        pool = None
        for b in range(a.max_batch, 0, -1):  # largest first: the pool is sized once
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(2):
                    model.forward(self.tok[:b], self.pos[:b], self.slots[:b])
            torch.cuda.current_stream().wait_stream(s)
            gr = torch.cuda.CUDAGraph()
            with torch.cuda.graph(gr, pool=pool):
                idx, val = model.forward(self.tok[:b], self.pos[:b], self.slots[:b])
            pool = gr.pool()
            self.graphs[b] = (gr, idx, val)
        torch.cuda.synchronize()

    def decode(self, active: list[Req]) -> tuple[list[int], list[float]]:
        b = len(active)
        self.tok[:b, 0].copy_(torch.tensor([r.last for r in active]), non_blocking=True)
        self.pos[:b].copy_(torch.tensor([r.pos for r in active]), non_blocking=True)
        self.slots[:b].copy_(torch.tensor([r.slot for r in active]), non_blocking=True)
        if b in self.graphs:
            gr, idx, val = self.graphs[b]
            gr.replay()
        else:
            idx, val = self.m.forward(self.tok[:b], self.pos[:b], self.slots[:b])
        return idx.tolist(), val.tolist()

    def run(self) -> None:
        free = list(range(self.a.max_batch - 1, -1, -1))
        active: list[Req] = []
        while True:
            while free:
                try:
                    r = self.pending.get(block=not active, timeout=None)
                except queue.Empty:
                    break
                r.slot = free.pop()
                dev = self.m.dev
                idx, val = self.m.forward(torch.tensor([r.prompt], device=dev), torch.zeros(1, dtype=torch.long,
                                          device=dev), torch.tensor([r.slot], device=dev))
                r.last, r.pos, r.produced = int(idx.item()), len(r.prompt), 1
                r.emit((r.last, float(val.item())))
                if r.produced >= r.max_tokens:
                    r.emit(None)
                    free.append(r.slot)
                else:
                    active.append(r)
                if not self.pending.qsize():
                    break
            self.running = len(active)
            if not active:
                continue
            self.steps[len(active)] = self.steps.get(len(active), 0) + 1
            toks, vals = self.decode(active)
            still = []
            for r, t, v in zip(active, toks, vals):
                r.last, r.pos, r.produced = t, r.pos + 1, r.produced + 1
                r.emit((t, v))
                if r.produced >= r.max_tokens:
                    r.emit(None)
                    free.append(r.slot)
                else:
                    still.append(r)
            active = still


# ---- HTTP ----------------------------------------------------------------------------------------------------------

def text_of(t: int) -> str:
    return f" t{t}"


async def serve(a: argparse.Namespace, eng: Engine, main_log) -> None:
    loop = asyncio.get_running_loop()
    created = int(time.time())
    counter = [0]

    async def respond(w: asyncio.StreamWriter, code: int, body: dict | str, ctype: str = "application/json") -> None:
        data = (json.dumps(body) if isinstance(body, dict) else body).encode()
        w.write(f"HTTP/1.1 {code} {'OK' if code == 200 else 'Error'}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        await w.drain()

    async def completions(w: asyncio.StreamWriter, body: dict) -> None:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        max_tokens = body.get("max_tokens", 16)
        if not isinstance(prompt, str) or not isinstance(max_tokens, int) or max_tokens < 1:
            await respond(w, 400, {"error": {"message": "prompt (a string) and max_tokens (>= 1) are required"}})
            return
        words = prompt.split() or ["<s>"]
        limit = a.max_ctx - max_tokens
        if limit < 1:
            await respond(w, 400, {"error": {"message": f"max_tokens over the context ({a.max_ctx})"}})
            return
        ids = [zlib.crc32(x.encode()) % a.vocab for x in words][-limit:]
        r = Req(ids, max_tokens, loop)
        counter[0] += 1
        rid = f"cmpl-{counter[0]}"
        eng.pending.put(r)
        want_lp = body.get("logprobs") is not None
        if not body.get("stream"):
            toks = []
            while (item := await r.q.get()) is not None:
                toks.append(item)
            lp = ({"tokens": [text_of(t) for t, _ in toks], "token_logprobs": [v for _, v in toks],
                   "top_logprobs": None, "text_offset": list(range(len(toks)))} if want_lp else None)
            await respond(w, 200, {"id": rid, "object": "text_completion", "created": created, "model": a.model,
                                   "choices": [{"index": 0, "text": "".join(text_of(t) for t, _ in toks),
                                                "logprobs": lp, "finish_reason": "length"}],
                                   "usage": {"prompt_tokens": len(ids), "completion_tokens": len(toks),
                                             "total_tokens": len(ids) + len(toks)}})
            return
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")

        def chunk(s: str) -> bytes:
            b = s.encode()
            return f"{len(b):x}\r\n".encode() + b + b"\r\n"
        n = 0
        while (item := await r.q.get()) is not None:
            t, v = item
            n += 1
            lp = {"tokens": [text_of(t)], "token_logprobs": [v], "top_logprobs": None, "text_offset": [0]}
            ev = {"id": rid, "object": "text_completion", "created": created, "model": a.model,
                  "choices": [{"index": 0, "text": text_of(t), "logprobs": lp if want_lp else None,
                               "finish_reason": "length" if n == max_tokens else None}]}
            w.write(chunk(f"data: {json.dumps(ev)}\n\n"))
            await w.drain()
        usage = {"prompt_tokens": len(ids), "completion_tokens": n, "total_tokens": len(ids) + n}
        w.write(chunk(f"data: {json.dumps({'id': rid, 'choices': [], 'usage': usage})}\n\n")
                + chunk("data: [DONE]\n\n") + b"0\r\n\r\n")
        await w.drain()

    def metrics() -> str:
        lines = [f'vllm:num_requests_running{{model_name="{a.model}"}} {eng.running}']
        cum = 0
        for le in (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512):
            cum = sum(v for k, v in eng.steps.items() if k <= le)
            lines.append(f'vllm:iteration_tokens_total_bucket{{le="{le}",model_name="{a.model}"}} {cum}')
        lines.append(f'vllm:iteration_tokens_total_bucket{{le="+Inf",model_name="{a.model}"}} '
                     f'{sum(eng.steps.values())}')
        return "\n".join(lines) + "\n"

    async def handle(rd: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await rd.readline()
                if not line:
                    return
                method, path, _ = line.decode().split(" ", 2)
                headers = {}
                while (h := await rd.readline()) not in (b"\r\n", b"\n", b""):
                    k, _, v = h.decode().partition(":")
                    headers[k.strip().lower()] = v.strip()
                body = await rd.readexactly(int(headers.get("content-length", "0")))
                if path == "/health":
                    await respond(w, 200, "ok", "text/plain")
                elif path == "/v1/models":
                    await respond(w, 200, {"object": "list", "data": [{"id": a.model, "object": "model"}]})
                elif path == "/metrics":
                    await respond(w, 200, metrics(), "text/plain")
                elif path == "/v1/completions" and method == "POST":
                    try:
                        req = json.loads(body)
                    except ValueError:
                        await respond(w, 400, {"error": {"message": "body is not JSON"}})
                        continue
                    await completions(w, req)
                else:
                    await respond(w, 404, {"error": {"message": f"no route {method} {path}"}})
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            w.close()

    srv = await asyncio.start_server(handle, a.host, a.port)
    main_log(f"ready on port {a.port}")
    async with srv:
        await srv.serve_forever()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--log-file", required=True)
    p.add_argument("--model", default="ab-decoder")
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--inter", type=int, default=14336)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--max-batch", type=int, default=40)
    p.add_argument("--max-ctx", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gfx", default="")
    p.add_argument("--cu-num", type=int, default=0)
    p.add_argument("--no-graphs", dest="graphs", action="store_false")
    a = p.parse_args()
    main_fh = open(a.log_file, "a", buffering=1)
    rank_fh = open(f"{a.log_file}.rank0", "a", buffering=1)

    def main_log(msg: str) -> None:
        main_fh.write(f"{time.strftime('%H:%M:%S')} {msg}\n")

    def aiter_log(msg: str) -> None:
        rank_fh.write(f"[aiter] INFO {time.strftime('%H:%M:%S')} rank=0 pid={os.getpid()} {msg}\n")

    env = os.environ.get(FAMILY.env_var)
    overlay = Overlay(env, a.gfx, a.cu_num, aiter_log) if env else None
    t0 = time.monotonic()
    model = Decoder(a, overlay)
    eng = Engine(a, model)
    main_log(f"{FAMILY.env_var}={env!r} rows={len(overlay.rows) if overlay else 0} graphs={len(eng.graphs)} {eng.capture_error} "
             f"start-up {time.monotonic() - t0:.1f}s")
    threading.Thread(target=eng.run, daemon=True).start()
    asyncio.run(serve(a, eng, main_log))


if __name__ == "__main__":
    main()
