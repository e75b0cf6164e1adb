"""Call AITER's own table lookup for captured shapes: what `aiter-tuner verify --engagement` runs inside
the served image (AITER imported for real), and what tests/differential runs on CPU (AITER's same files with
the hardware queries stubbed). A probe returns (hit, row) per shape; the row is the tuned row AITER uses.

Which AITER function a family is looked up with is the family's data (TableFamily.aiter_lookup). A family with
op_entries (the GEMMs) is probed through the op itself (op_probe: meta tensors of the shape, only its kernel
launchers stubbed, so its own remaps, asserts and libtype branches decide); where the op is a torch custom op (a real
AITER's torch_compile_guard) its lookup is called as the op calls it. The MoE argument building mirrors the op's
caller (fused_moe.py:733-904), nothing more.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib
import inspect
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

Probe = Callable[[dict[str, str]], tuple[bool, dict | None]]


class ProbeBroken(RuntimeError):
    """The probe itself went wrong (the op did not get to a kernel, the lookup's log line never came): never
    taken for AITER raising on the shape."""


def outcome(look: Probe, shape: dict[str, str]) -> tuple[bool, dict | None, str | None]:
    """(hit, row, what AITER raised on this shape or None): a raise is a verdict of its own (the server would
    crash on this call), never a miss."""
    try:
        hit, cfg = look(shape)
    except ProbeBroken:
        raise
    except Exception as e:  # noqa: BLE001  AITER's own code raised on this shape
        return False, None, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return hit, cfg, None


def _torch_dtype(name: str) -> Any:
    import torch
    return getattr(torch, name.removeprefix("torch."), name)


def bf16_probe(tuned_gemm: Any) -> Probe:
    fn = tuned_gemm.get_GEMM_A16W16_config
    params = inspect.signature(fn).parameters

    def probe(s):
        kw = dict(M=int(s["M"]), N=int(s["N"]), K=int(s["K"]), bias=s["bias"] == "True", dtype=s["dtype"],
                  otype=s["outdtype"], scaleAB=s["scaleAB"] == "True")
        if "bpreshuffle" in params:
            kw["bpreshuffle"] = s["bpreshuffle"] == "True"
        cfg = fn(**kw)
        return (cfg is not None and "us" in cfg), cfg  # a miss returns a default config, not a tuned row
    return probe


def libtype_dispatch(op_source: str, op: str) -> tuple[dict[str, bool], str]:
    """How AITER's op uses the row its lookup returned, read from the op's own code: the libtypes it compares the
    row's libtype with (True where that branch also needs is_flydsl_available()), and what any other libtype
    gets: "fails" where the chain ends in `assert 0`, else "default" (it falls through to the default kernel)."""
    import ast
    fn = next(n for n in ast.walk(ast.parse(op_source)) if isinstance(n, ast.FunctionDef) and n.name == op)

    def is_libtype(e: ast.AST) -> bool:
        return (isinstance(e, ast.Name) and e.id == "libtype") or (
            isinstance(e, ast.Subscript) and isinstance(e.slice, ast.Constant) and e.slice.value == "libtype")
    def compared(c: ast.AST) -> str | None:  # `libtype == "<name>"`: the name (a libtype is a string)
        if not (isinstance(c, ast.Compare) and is_libtype(c.left) and isinstance(c.ops[0], ast.Eq)):
            return None
        first = c.comparators[0]
        return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None
    runs: dict[str, bool] = {}
    other = "default"
    for node in ast.walk(fn):
        if not isinstance(node, ast.If):
            continue
        names = [n for c in ast.walk(node.test) if (n := compared(c)) is not None]
        if not names:
            continue
        flydsl = any(isinstance(c, ast.Call) and getattr(c.func, "id", "") == "is_flydsl_available"
                     for c in ast.walk(node.test))
        runs.update({n: flydsl for n in names})
        if any(isinstance(x, ast.Assert) and isinstance(x.test, ast.Constant) and not x.test.value
               for x in node.orelse):
            other = "fails"
    return runs, other


class Launched(Exception):
    """Raised from a stubbed kernel launcher: the op got past its lookup and chose this kernel, which runs rows of
    this libtype ("*": any row)."""

    def __init__(self, kernel: str, libtype: str = "*"):
        self.kernel, self.libtype = kernel, libtype


_ABSENT = object()


def _target(ns: dict, target: str, importer: Callable[[str], Any]) -> tuple[Any, str]:
    """(the object holding a launcher, its attribute name): "name" (the op module's namespace itself), "F.linear"
    (an attribute of a name there), "package.module:name" (a module the op imports in its body)."""
    if ":" in target:
        modname, attr = target.split(":")
        holder = importer(modname)
    else:
        head, _, attr = target.partition(".")
        if not attr:
            return ns, head
        holder = ns[head]
    *mid, last = attr.split(".")
    for a in mid:
        holder = getattr(holder, a)
    return holder, last


def _patch(holder: Any, name: str, value: Any) -> Any:
    old = holder.get(name, _ABSENT) if isinstance(holder, dict) else getattr(holder, name, _ABSENT)
    if isinstance(holder, dict):
        holder[name] = value
    else:
        setattr(holder, name, value)
    return old


def _unpatch(holder: Any, name: str, old: Any) -> None:
    if isinstance(holder, dict):
        if old is _ABSENT:
            holder.pop(name, None)
        else:
            holder[name] = old
    elif old is _ABSENT:
        delattr(holder, name)
    else:
        setattr(holder, name, old)


def op_function(mod: Any, entry: Any, beside: str | None = None) -> Callable | None:
    """The op's own Python function: as the module holds it, or, where that is a torch_compile_guard'ed op (in a
    real AITER a torch custom op: called with meta tensors it runs its fake, never the op), its body compiled anew
    without decorators from the file that defines `beside` (undecorated); None where neither can be had."""
    fn = vars(mod).get(entry.function)
    if callable(fn) and getattr(fn, "__qualname__", None) == entry.function:
        return fn
    if beside is None:
        return None
    try:
        return undecorated(vars(mod), entry.function, beside)
    except (OSError, KeyError, StopIteration, SyntaxError, TypeError, AttributeError):
        return None  # no source beside the module (a compiled-only install)


def op_args(entry: Any, s: dict, dtypes: Any) -> tuple[list, dict]:
    """The op's arguments for a shape (OpArg): meta tensors, nothing allocated; dtypes: AITER's aiter.utility.dtypes."""
    import torch
    ints = {k: int(v) for k, v in s.items() if str(v).lstrip("-").isdigit()}

    def dtype(spec: str) -> Any:
        if spec.startswith("@"):
            return _torch_dtype(s[spec[1:]])
        where, name = spec.split(".", 1)
        return getattr(dtypes if where == "dtypes" else torch, name)
    args: list = []
    kw: dict = {}
    for a in entry.args:
        if a.if_true is not None and s.get(a.if_true) != "True":
            value = None
        elif not a.dims:
            value = dtype(a.dtype)
        else:
            value = torch.empty([eval(d, {"__builtins__": {}}, ints) for d in a.dims], dtype=dtype(a.dtype),
                                device="meta")
            for attr, col in a.attrs:
                if s.get(col) == "True":
                    setattr(value, attr, True)
        if a.keyword is None:
            args.append(value)
        elif value is not None:
            kw[a.keyword] = value
    return args, kw


def op_probe(mod: Any, family: Any, ops: dict[str, Callable], importer: Callable[[str], Any],
             cpp_kernel: Callable[[dict, dict], Any] | None = None) -> Probe:
    """Call the op a server calls for the shape (family.op_entries) with meta tensors of the shape, its kernel
    launchers stubbed (they raise Launched): the op builds the lookup's arguments itself (its remaps), and its own
    dispatch after the lookup (libtype branches, asserts, defaults) picks the launcher. A hit: the lookup returned a
    tuned row and the launcher reached runs that row's libtype (and, where the compiled table picks the kernel,
    its kernel is the row's). What AITER raises propagates: the shape's verdict. ops: each entry's function
    (op_function), resolved once by make_probe, not per shape."""
    ns = vars(mod)
    lookup = family.aiter_lookup.split(":")[1]

    def probe(s):
        entry = family.op_entry(s)
        if entry is None:
            raise ProbeBroken(f"no op of {family.name} serves {s}")
        op, real = ops[entry.function], ns[lookup]
        got: list[Any] = []

        spy = _recording(real, got)
        spy.__dict__ = real.__dict__  # the lookup keeps its table as an attribute of its global name (batched)

        def launcher(name: str, libtype: str) -> Callable:
            def launch(*a, **k):
                raise Launched(name, libtype)
            return launch
        wr = family.weight_retry  # a shape without the weight's K: the weight is the activation's size
        if wr is not None and wr.cell not in s:
            s = {**s, wr.cell: s[wr.column]}
        args, kw = op_args(entry, s, importer("aiter.utility.dtypes"))
        patched = [(ns, lookup, _patch(ns, lookup, spy))]
        try:
            for target, libtype in entry.launchers:
                try:
                    holder, name = _target(ns, target, importer)
                except (KeyError, AttributeError, ImportError):
                    continue  # not in this AITER: the op cannot reach it either (a launch of it would not stop here)
                patched.append((holder, name, _patch(holder, name, launcher(target, libtype))))
            op(*args, **kw)
        except Launched as e:
            launched = e
        else:
            raise ProbeBroken(f"{entry.function} returned without launching any of {entry.launchers}")
        finally:
            for holder, name, old in reversed(patched):
                _unpatch(holder, name, old)
        if not got:
            raise ProbeBroken(f"{entry.function} launched {launched.kernel} without calling {lookup}")
        cfg = got[-1]
        tuned = cfg is not None and "us" in cfg  # bf16's lookup returns a default config without one on a miss
        hit = tuned and launched.libtype in ("*", str(cfg.get("libtype")))
        if hit and cpp_kernel is not None:
            hit = cpp_kernel(s, cfg) == int(cfg["kernelId"])
        return hit, cfg
    return probe


def lookup_probe(fn: Callable, family: Any, tuned_file: str | None, flydsl: bool,
                 cpp_kernel: Callable[[dict, dict], Any] | None = None, op_source: str | None = None) -> Probe:
    """Any lookup whose arguments family.aiter_args names (a GEMM family whose op cannot be called here: a torch
    custom op in a real AITER, see op_function). Where the op dispatches on the
    row's libtype (family.aiter_op), a hit needs the op to run that libtype (libtype_dispatch, from the op's
    source); where the compiled table's kernel can be told (cpp_kernel), it must be the row's (Python supplies
    only splitK)."""
    runs, other = (libtype_dispatch(op_source, family.aiter_op) if family.aiter_op and op_source
                   else ({}, "hit"))

    def arg(s: dict, a: str) -> Any:
        if a == "@file":
            return tuned_file
        return _torch_dtype(s[a]) if a == "q_dtype_w" else int(s[a])

    def probe(s):
        cfg = fn(*(arg(s, a) for a in family.aiter_args))
        hit = cfg is not None
        # another op reads these rows without a libtype switch (int8 bpreshuffle rows: gemm_a8w8_ASM)
        other_op = any(s.get(c) == v for c, v in family.libtype_use_unless)
        if hit and runs and not other_op:
            lt = str(cfg.get("libtype"))
            hit = (lt in runs and (flydsl or not runs[lt])) or (lt not in runs and other == "hit")
        if hit and cpp_kernel is not None:
            hit = cpp_kernel(s, cfg) == int(cfg["kernelId"])
        return hit, cfg
    return probe


class KernelNotFound(RuntimeError):
    """A stage launcher handed a kernel name it does not run: what AITER raises at launch ('not find kernel')."""


class _RecordUsing:
    """The module's logger, recording the row fused_moe's lookup settled on at its 'using ... for {keys}' line
    (fused_moe.py:2460; the row before it is discarded or kept) with the line, held back: only the call the probe
    takes logs it (lines)."""

    def __init__(self, inner: Any, rows: list):
        self._inner, self._rows = inner, rows

    def info(self, msg, *a, **k):
        if str(msg).startswith("[fused_moe] using"):
            caller = inspect.currentframe().f_back  # type: ignore[union-attr]  # CPython: a called frame has one
            self._rows.append((caller.f_locals.get("cfg") if caller else None, (msg, a, k)))
            return None
        return self._inner.info(msg, *a, **k)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def _kernel_cell(v: Any) -> str:
    s = "" if v is None or v != v else str(v).strip()  # pandas reads an empty cell as NaN
    return "" if s == "Null" else s


def _recording(real: Callable, got: list) -> Callable:
    """real, recording what it returns in got: what the op's lookup handed back to it."""
    def spy(*a, **k):
        got.append(real(*a, **k))
        return got[-1]
    return spy


def moe_stages_run_row(path: Any, md: Any, cfg: dict | None) -> bool:
    """Whether the stages the op's metadata holds run the row's kernels (family.moe_op.launchers): a launcher
    taking a name runs the row where it was handed the row's name, and raises where it was handed a name it
    does not run; one taking none runs the row where the row names a kernel of its kind."""
    stages = [(md.stage1, "kernelName1")]
    if not md.run_1stage and md.stage2 is not None:
        stages.append((md.stage2, "kernelName2"))
    ran = []
    for part, col in stages:
        fn = getattr(part, "func", part)
        name = getattr(fn, "__name__", None)
        la = path.launcher(name)
        if la is None:
            raise ProbeBroken(f"the MoE op's stage launcher {name!r} is not in the family's moe_op.launchers")
        row_name = "" if cfg is None else _kernel_cell(cfg.get(col))
        if la.kernel_arg:
            got = _kernel_cell(part.keywords.get(la.kernel_arg, ""))
            if got and not re.match(la.runs, got):
                raise KernelNotFound(f"{name}: not find kernel {got!r}")
            if row_name:
                ran.append(got == row_name)
        elif row_name:
            ran.append(re.match(la.runs, row_name) is not None)
    return cfg is not None and bool(ran) and all(ran)


def undecorated(ns: dict, name: str, beside: str) -> Callable:
    """The module's function `name` as AITER wrote it, without its decorators, compiled from the file that
    defines `beside`: torch_compile_guard registers fused_moe_ as a torch custom op whose call with meta tensors
    runs its FAKE impl (aiter/jit/utils/torch_guard.py wrapper_custom keeps no reference to the function)."""
    import ast
    path = inspect.unwrap(ns[beside]).__code__.co_filename
    tree = ast.parse(Path(path).read_text(), path)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    fn.decorator_list = []
    kept = ns[name]
    exec(compile(ast.Module([fn], []), path, "exec"), ns)  # the module's globals: the probe's stubs reach it
    body, ns[name] = ns[name], kept
    return body


def _fhmoe_shared(fh: Any, E: int, dim: int, inter: int) -> dict:
    """The shared-expert arguments of a fused_moe call fhmoe_ takes (aiter/fhmoe.py:86-141 checks them): fp8 shared
    weights, e8m0 scales (uint8 storage) of the preshuffled sizes, shared_expert_id E - 1 (any other raises
    before the lookup, which keys on expert - 1 whatever the call passes)."""
    import torch

    def meta(*shape, dt=torch.uint8):
        return torch.empty(shape, dtype=dt, device="meta")
    up = lambda n, k: (n + k - 1) // k * k  # noqa: E731
    s2k, fp8 = up(inter, 256), vars(fh)["dtypes"].fp8
    return dict(shared_w1=meta(1, 2 * inter, dim, dt=fp8), shared_w2=meta(1, dim, inter, dt=fp8),
                shared_w1_scale=meta(up(2 * inter, 256), up(dim // 32, 8)),
                shared_w2_scale=meta(up(dim, 256), up(s2k // 32, 8)), w1_scale=meta(E * 2 * inter * (dim // 32)),
                w2_scale=meta(E * dim * (s2k // 32)), shared_expert_id=E - 1)


@dataclass
class _MoeOp:
    """What moe_op_probe calls fused_moe with: the op's module namespace (ns), its lookup, its signature's
    parameters, the enums, the device's gfx, aiter/fhmoe.py's module, and fused_moe_ / fhmoe_ undecorated."""
    ns: dict
    family: Any
    lookup: Callable
    params: Any
    ActivationType: Any
    QuantType: Any
    gfx: str
    fhmoe: Any
    body: Callable
    fh_body: Callable | None


def moe_op_probe(mod: Any, family: Any, ActivationType: Any, QuantType: Any, gfx: str,
                 fhmoe: Any = None) -> Probe:
    """fused_moe (the entry the server calls) with meta tensors of the shape: hidden_states [token, model_dim] of
    dtype, w1 [expert, inter_dim * (2 if use_g1u1), model_dim] and w2 [expert, model_dim, inter_dim] of q_dtype_w
    (marked is_shuffled, as the serving frameworks prepare them), topk ids/weights [token, topk]. The op derives its
    own lookup arguments (q_dtype_a, quant_remap, the padded token) and builds its stages; the first kernel launch
    (moe_sorting) ends the call. The row its lookup found, and whether its stages run that row, is the verdict.
    A capture does not say which of the calls in family.moe_op.call_variants it came from: each is made, and the
    first whose lookup is keyed on the captured q_dtype_a is the one taken (else the default, the first). fhmoe:
    aiter/fhmoe.py's module, for the call_variant entries "fhmoe" and "shared" (fused_moe with shared-expert weights,
    fhmoe_ run undecorated, its wrapper step on the stages included): fhmoe's verdict is the lookup of its own table
    (config_file), fmoe's "shared" call's (a shared-expert call outside the DSV4 I384 contract) that of tuned_fmoe."""
    ns = vars(mod)
    path = family.moe_op
    not_aiters = [n for n in path.needs if not inspect.isfunction(ns.get(n))]
    if not_aiters:
        raise ProbeBroken(f"the MoE op's dispatch needs AITER's own {not_aiters} (a stub would decide for it)")
    op = _MoeOp(ns, family, ns["get_2stage_cfgs"], inspect.signature(ns["fused_moe"]).parameters, ActivationType,
                QuantType, gfx, fhmoe, undecorated(ns, "fused_moe_", "get_inter_dim"),
                undecorated(vars(fhmoe), "fhmoe_", "_fhmoe") if fhmoe is not None else None)

    def probe(s):
        # the calls the shape allows (a shape may say its entry or gate mode; a capture's does not)
        made = [_moe_call(op, s, dict(v)) for v in path.call_variants if all(s.get(k, x) == x for k, x in v)]
        want = str(family.remap(s).get("q_dtype_a"))
        _, res, raised, lines = next((m for m in made if m[0] == want), made[0])
        for msg, a, k in lines:  # the server's log: the call it made
            ns["logger"].info(msg, *a, **k)
        if raised is not None:
            raise raised
        return res
    return probe


def _moe_tensors(s: dict) -> tuple[Any, ...]:
    """fused_moe's positional arguments for the shape, as meta tensors (moe_op_probe)."""
    import torch
    M, E, topk = int(s["token"]), int(s["expert"]), int(s["topk"])
    dim, inter = int(s["model_dim"]), int(s["inter_dim"])
    w, dtype = _torch_dtype(s["q_dtype_w"]), _torch_dtype(s["dtype"])
    w1 = torch.empty((E, inter * (2 if int(s["use_g1u1"]) else 1), dim), dtype=w, device="meta")
    w2 = torch.empty((E, dim, inter), dtype=w, device="meta")
    for t in (w1, w2):  # what AITER's shuffle_weight marks (the op reads it: is_shuffled)
        setattr(t, "is_shuffled", True)
    return (torch.empty((M, dim), dtype=dtype, device="meta"), w1, w2,
            torch.empty((M, topk), dtype=torch.float32, device="meta"),
            torch.empty((M, topk), dtype=torch.int32, device="meta"))


def _moe_kwargs(op: _MoeOp, s: dict, variant: dict) -> dict[str, Any] | None:
    """fused_moe's keyword arguments for the shape and the call variant; None: not a call the shared-expert entry
    makes for these cells."""
    kw: dict[str, Any] = dict(activation=getattr(op.ActivationType, s["act_type"].split(".")[1]),
                              quant_type=getattr(op.QuantType, s["q_type"].split(".")[1]),
                              doweight_stage1=bool(int(s["doweight_stage1"])))
    gate = variant.get("gate_mode", s.get("gate_mode"))
    if "gate_mode" in op.params and gate:
        kw["gate_mode"] = op.ns["GateMode"][gate.split(".")[1]].value
    if variant.get("entry") == "shared":
        path, cells = op.family.moe_op, dict(op.family.remap(s), **variant)
        arch = op.ns["get_gfx"]()  # what the op's branches read (GPU_ARCHS)
        qa = path.q_dtype_a(cells, op.gfx, arch) if path.variant(cells, op.gfx, arch) == variant else ""
        if not qa:
            return None
    return kw


def _moe_call(op: _MoeOp, s: dict, variant: dict) -> tuple[Any, Any, Any, list]:
    """One call of moe_op_probe: (the lookup's q_dtype_a argument or None, (hit, row) or None, what AITER raised or
    None, its log lines)."""
    rows: list = []
    got: list = []
    keyed: list = []
    own: list = []  # per lookup: of the family's own table (config_file)
    # issue 35 (w35b): a shared-expert call is fused_moe with shared weights, which goes to fhmoe_ (fused_moe.py
    # :495-536), as fhmoe's own calls do: its contract, its _q_dtype_a and the wrapper step it applies to the
    # stages whatever table it read (_use_fhmoe_wrappers, fhmoe.py:304-317, :563-613) are AITER's own
    fh = variant.get("entry") == "fhmoe"
    shared = variant.get("entry") in ("shared", "fhmoe")

    def spy(*a, **k):
        keyed.append(str(a[6]))  # get_2stage_cfgs(token, model_dim, inter_dim, expert, topk, dtype, q_dtype_a
        own.append((k.get("config_file") is not None) == fh)  # fhmoe's table, or (fmoe's shared call) not
        got.append(op.lookup(*a, **k))
        return got[-1]
    args = _moe_tensors(s)
    kw = _moe_kwargs(op, s, variant)
    if kw is None:
        return None, None, None, []
    if shared and op.fhmoe is None:
        raise ProbeBroken("this AITER has no aiter/fhmoe.py: its shared-expert entry cannot be called")
    if shared:
        kw.update(_fhmoe_shared(op.fhmoe, int(s["expert"]), int(s["model_dim"]), int(s["inter_dim"])))
    raised = _launch(op, shared, spy, rows, args, kw)
    if raised is not None:
        # fhmoe: the lines of its tier lookups are not this call's (the service reads each as its own tier's)
        return (keyed[-1] if keyed else None), None, raised, [] if shared else [x for _, x in rows]
    if not got or not rows:
        raise ProbeBroken("fused_moe launched a kernel without its lookup's 'using' line")
    # fhmoe's tier lookups (fhmoe.py:345-385, cached per token) come first: the call's own is the last
    lines = ([x for _, x in rows][-1:] if own[-1] else []) if shared else [x for _, x in rows]
    try:
        hit = moe_stages_run_row(op.family.moe_op, got[-1], rows[-1][0]) and own[-1]
        # a row of another table (a shared-expert call's in the DSV4 I384 contract) is none of this table's
        return keyed[-1], (hit, rows[-1][0] if own[-1] else None), None, lines
    except KernelNotFound as e:
        return keyed[-1], None, e, lines


def _launch(op: _MoeOp, shared: bool, spy: Callable, rows: list, args: tuple, kw: dict) -> Exception | None:
    """fused_moe(*args, **kw) with the lookup spied on, the 'using' lines recorded into rows, fused_moe_ (and for a
    shared-expert call fhmoe_) undecorated, up to its first kernel launch (moe_sorting): what AITER raised, or
    None."""
    def sorting(*a, **k):
        raise Launched("moe_sorting")
    ns = op.ns
    if shared:
        vars(op.fhmoe)["fhmoe_"], kept = op.fh_body, vars(op.fhmoe)["fhmoe_"]
    saved = {n: ns[n] for n in ("get_2stage_cfgs", "moe_sorting", "logger", "fused_moe_")}
    ns.update(get_2stage_cfgs=spy, moe_sorting=sorting, logger=_RecordUsing(ns["logger"], rows), fused_moe_=op.body)
    if hasattr(op.lookup, "cache_clear"):
        op.lookup.cache_clear()  # a cached call logs no line: every call looks up anew
    try:
        ns["fused_moe"](*args, **kw)
    except Launched:
        return None
    except ProbeBroken:
        raise
    except Exception as e:  # noqa: BLE001  AITER raised on this call (after its lookup, or before)
        return e
    else:
        raise ProbeBroken("fused_moe returned without launching moe_sorting")
    finally:
        ns.update(saved)
        if shared:
            vars(op.fhmoe)["fhmoe_"] = kept


def grouped_op_probe(grouped: Any, ActivationType: Any, QuantType: Any) -> Probe:
    """grouped_gemm_gfx1250_a8w4 (the entry fused_moe calls for a gate/up-interleaved call with FlyDSL) with meta
    tensors of the shape and per-1x32 e8m0 scales: its own eligibility checks, token padding and EP topk, then
    _find_grouped_config; its TDM launcher (_grouped_a8w4_tdm_moe) ends the call. hit: a row found and the TDM
    path launched with it; the entry returning None (the caller's generic MoE runs) is a miss."""
    import torch
    ns = vars(grouped)
    real = ns["_find_grouped_config"]

    def probe(s):
        got: list = []
        spy = _recording(real, got)

        def tdm(*a, **k):
            raise Launched("_grouped_a8w4_tdm_moe")
        M, E, topk = int(s["token"]), int(s["expert"]), int(s["topk"])
        dim, inter, g1u1 = int(s["model_dim"]), int(s["inter_dim"]), bool(int(s["use_g1u1"]))
        w, dtype = _torch_dtype(s["q_dtype_w"]), _torch_dtype(s["dtype"])
        ep = topk == -1  # an expert-parallel call: the lookup keys topk as -1 (grouped_moe_gfx1250.py:1032)
        topk = 1 if ep else topk

        def meta(*shape, dt=torch.uint8):
            return torch.empty(shape, dtype=dt, device="meta")
        n1 = inter * (2 if g1u1 else 1)
        saved = {n: ns[n] for n in ("_find_grouped_config", "_grouped_a8w4_tdm_moe")}
        ns.update(_find_grouped_config=spy, _grouped_a8w4_tdm_moe=tdm)
        try:
            ns["grouped_gemm_gfx1250_a8w4"](
                meta(M, dim, dt=dtype), meta(E, n1, dim, dt=w), meta(E, dim, inter, dt=w),
                meta(M, topk, dt=torch.float32), meta(M, topk, dt=torch.int32), E=E, model_dim=dim, inter_dim=inter,
                dtype=dtype, activation=getattr(ActivationType, s["act_type"].split(".")[1]),
                quant_type=getattr(QuantType, s["q_type"].split(".")[1]), q_dtype_a=_torch_dtype(s["q_dtype_a"]),
                q_dtype_w=w, isG1U1=g1u1, doweight_stage1=bool(int(s["doweight_stage1"])),
                w1_scale=meta(E, n1, max(1, dim // 32)), w2_scale=meta(E, dim, max(1, inter // 32)),
                expert_mask=meta(E, dt=torch.int32) if ep else None, hidden_pad=0, intermediate_pad=0, bias1=None,
                bias2=None)
        except Launched:
            launched = True
        else:
            launched = False  # None: the caller's generic MoE runs the call
        finally:
            ns.update(saved)
        row = got[-1] if got else None
        return launched and row is not None, row
    return probe


def gdn_op_probe(prefill: Any) -> Probe:
    """chunk_gated_delta_rule_fwd_h_flydsl_opt (the K5 opt entry, the one that calls _tuned_bv) with meta tensors of
    the shape (K=128, chunk 64, as the op requires): dense, B = total_chunks / max_seq_chunks sequences of
    max_seq_chunks chunks; varlen, one sequence of max_seq_chunks chunks and one-chunk sequences for the rest, with
    the chunk schedule a serving framework hands it (prefill_metadata). Its kernel build (_get_or_compile_opt)
    ends the call. hit: the BV it builds is the one its table lookup returned."""
    import types

    import torch
    ns = vars(prefill)
    real = ns["_tuned_bv"]

    def probe(s):
        got: list = []
        spy = _recording(real, got)

        def build(*a, **k):
            raise Launched(f"_get_or_compile_opt BV={a[3]}")
        H, Hg, V = int(s["H"]), int(s["Hg"]), int(s["V"])
        total, most = int(s["total_chunks"]), int(s["max_seq_chunks"])
        varlen, flag = s["is_varlen"] == "True", (lambda c: s[c] == "True")
        state = torch.bfloat16 if flag("state_bf16") else torch.float32
        if varlen:
            seqs = [most] + [1] * (total - most)
        elif total % most == 0:
            seqs = [most] * (total // most)
        else:
            raise ProbeBroken(f"a dense call has total_chunks a multiple of max_seq_chunks: {s}")
        B, N, T = (1, len(seqs), 64 * sum(seqs)) if varlen else (len(seqs), len(seqs), 64 * most)

        def meta(*shape, dt=torch.bfloat16):
            return torch.empty(shape, dtype=dt, device="meta")
        kw: dict = dict(initial_state=meta(N, H, V, 128, dt=state) if flag("use_h0") else None, state_dtype=state,
                        output_final_state=flag("store_fs"),
                        snapshot_dtype=torch.bfloat16 if flag("snapshot_bf16") else torch.float32)
        if varlen:
            offs = [0]
            for n in seqs:
                offs.append(offs[-1] + n)
            sched = types.SimpleNamespace(total_chunks=total, chunk_offsets=meta(N + 1, dt=torch.int32),
                                          kernel_cu_seqlens=meta(N + 1, dt=torch.int32), n_prefill=N,
                                          max_seq_chunks=max(b - a for a, b in zip(offs, offs[1:])))
            kw.update(cu_seqlens=meta(N + 1, dt=torch.int32), prefill_metadata=types.SimpleNamespace(
                validate=lambda **k: None, get_chunk_schedule=lambda *a, **k: sched))
        saved = {n: ns[n] for n in ("_tuned_bv", "_get_or_compile_opt", "_hipeq_select_bv")}
        # the default BV rule asks the device (LDS per CU, CU count: _hipeq_compute_bv): 16, a BV it can return
        ns.update(_tuned_bv=spy, _get_or_compile_opt=build, _hipeq_select_bv=lambda *a, **k: 16)
        try:
            ns["chunk_gated_delta_rule_fwd_h_flydsl_opt"](meta(B, T, Hg, 128), meta(B, H, T, 128), meta(B, H, T, V),
                                                           **kw)
        except Launched as e:
            launched = e.kernel
        else:
            raise ProbeBroken("the K5 opt entry returned without building its kernel")
        finally:
            ns.update(saved)
        bv = got[-1] if got else None
        return bv is not None and launched.endswith(f"BV={bv}"), None if bv is None else {"BV": bv}
    return probe


def _cpp_block(csrc: Path, family: Any) -> tuple[str, str] | None:
    """nextPow2 and the `int padded_m = M; ...` block of the compiled dispatch, cut verbatim (gemm_a8w8.cu
    rowwise_dispatch; batched_gemm_*.cu batched_rowwise_dispatch: the tuner script's folder)."""
    folder = family.tuner_script.split("/")[1] if family.tuner_script else "ck_gemm_a8w8"
    path = next(iter(sorted((csrc / folder).glob("*.cu"), key=lambda p: "tune" in p.name)), None) \
        if (csrc / folder).is_dir() else None
    if path is None:
        return None
    text = path.read_text()
    pow2 = re.search(r"static constexpr int nextPow2\(unsigned int num\)\s*\{.*?\n\}", text, re.S)
    block = re.search(r"(int padded_m\s*=\s*M;.*?)\n\s*// Second check", text, re.S)
    return None if pow2 is None or block is None else (pow2.group(0), block.group(1))


def _cc(src: str, symbol: str) -> Any:
    out = Path(tempfile.gettempdir()) / f"aiter_cpp_padding_{hashlib.sha256(src.encode()).hexdigest()[:12]}.so"
    if not out.exists():
        c = out.with_suffix(f".{os.getpid()}.cpp")
        c.write_text(src)
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        try:
            subprocess.run(["g++", "-O1", "-shared", "-fPIC", str(c), "-o", str(tmp)], check=True,
                           capture_output=True, timeout=120)
        except (OSError, subprocess.SubprocessError):
            return None
        os.replace(tmp, out)
    fn = getattr(ctypes.CDLL(str(out)), symbol)
    fn.restype = ctypes.c_int
    return fn


def cpp_tries(csrc: Path, family: Any) -> Callable[[int, int, int], list[int]] | None:
    """The compiled table's M tries for (M, N, K), from AITER's C++ built with g++: family.cpp_padding "ck" cuts
    the dispatch's own padding block; "gemm" is getPaddedM (py_itfs_cu/gemm_common.cu) gl0 then gl1, as
    gemm_a8w8_bpreshuffle.cu:137-159 calls it. None without g++ or the source."""
    if family.cpp_padding == "gemm":
        path = csrc / "py_itfs_cu" / "gemm_common.cu"
        if not path.exists():
            return None
        body = path.read_text().replace('#include "gemm_common.h"', "")
        fn = _cc('#include <climits>\nextern "C" int getPaddedM(int M, int N, int K, int gl);\n' + body, "getPaddedM")
        if fn is None:
            return None
        fn.argtypes = [ctypes.c_int] * 4
        return lambda m, n, k: [m, fn(m, n, k, 0), fn(m, n, k, 1)]
    cut = _cpp_block(csrc, family)
    if cut is None:
        return None
    fn = _cc("#include <climits>\n" + cut[0] + '\nextern "C" int cppPaddedM(int M) {\n' + cut[1]
             + "\n  return padded_m;\n}\n", "cppPaddedM")
    if fn is None:
        return None
    fn.argtypes = [ctypes.c_int]
    return lambda m, n, k: [m, fn(m)]


def cpp_kernel_of(chip_info: Any, family: Any, tuned_file: str, gfx: str, cu_num: int,
                  tries: Callable[[int, int, int], list[int]], libtype: str | None) -> Callable[[dict, dict], Any]:
    """Which kernelId the compiled table runs: AITER's build_tune_dict (build_tune_dict_batched for B-keyed
    tables; the libtype filter its gen_instances passes) over the resolved CSV (0.1.7: its gen_instances' plain
    cu_num-filtered (M,N,K) dict), then the dispatch's exact-then-padded find."""
    import pandas as pd
    df = pd.read_csv(tuned_file)

    class Ids(dict):
        def get(self, k, default=None):
            return int(k)
    batched = "B" in family.cpp_key
    build = vars(chip_info).get("build_tune_dict_batched" if batched else "build_tune_dict")
    if callable(build) and "gfx" in df.columns:
        table = build(df, {}, Ids(), libtype=libtype)
        head: tuple = (gfx, cu_num)
    else:
        table = {(int(r["M"]), int(r["N"]), int(r["K"])): int(r["kernelId"])
                 for _, r in df.iterrows() if int(r["cu_num"]) == cu_num}
        head = ()

    wr = family.weight_retry

    def kernel(s, cfg):
        if libtype is not None and cfg.get("libtype") != libtype:
            return int(cfg["kernelId"])  # another library runs this row: the compiled table is not consulted
        # the compiled dispatch of a padded-weight op is keyed on the weight's K (gemm_a8w8_bpreshuffle.cu: WQK)
        M, N, K = int(s["M"]), int(s["N"]), int(s.get(wr.cell, s["K"]) if wr is not None else s["K"])
        b = (int(s["B"]),) if batched else ()
        for m in tries(M, N, K):
            if head + b + (m, N, K) in table:
                return table[head + b + (m, N, K)]
        return None
    return kernel


def needs_file(family: Any) -> bool:
    """Whether the probe is handed the resolved table (the lookup takes it as an argument, or the compiled table
    is rebuilt from it); other lookups resolve it themselves, as they do in the server."""
    return "@file" in family.aiter_args or family.cpp_key is not None


def resolved_file(core: Any, attr: str) -> str:
    """The table path AITER resolved (current: an AITER_CONFIGS property; 0.1.7: a module constant)."""
    configs = vars(core).get("AITER_CONFIGS")
    return getattr(configs, attr) if configs is not None and hasattr(type(configs), attr) else vars(core)[attr]


def make_probe(family: Any, load: Callable[[str], Any], enums: Any, flydsl: bool, gfx: str, cu_num: int,
               csrc: Path | None, tuned_file: str | None,
               importer: Callable[[str], Any] = importlib.import_module) -> Probe:
    """load('aiter/x.py') -> that module of the AITER at hand; enums: where ActivationType/QuantType live;
    importer: a module by its dotted name, as the op's own imports find it."""
    path, fn = family.aiter_lookup.split(":")
    mod = load(path)
    cpp = None
    if family.cpp_key is not None and csrc is not None and (tries := cpp_tries(csrc, family)) is not None:
        assert tuned_file is not None, "needs_file(family): the caller resolves the table the compiled one reads"
        cpp = cpp_kernel_of(load("aiter/jit/utils/chip_info.py"), family, tuned_file, gfx, cu_num, tries,
                            compiled_libtype(csrc, family))
    ops = {e.function: op for e in family.op_entries if (op := op_function(mod, e, fn)) is not None}
    if family.op_entries and len(ops) == len({e.function for e in family.op_entries}):
        return op_probe(mod, family, ops, importer, cpp)
    # where the op's own code cannot be had (no source in the image), its lookup, as the op calls it
    if fn == "get_GEMM_A16W16_config":
        return bf16_probe(mod)
    if fn == "get_2stage_cfgs" and family.moe_op is not None:
        loaded = {}
        for extra in family.moe_op.sources:  # the modules the op imports from (its grouped path, name parsing)
            try:
                loaded[extra] = load(extra)
            except ImportError:  # an image without FlyDSL: the op's own import of it fails the same way
                pass
        return moe_op_probe(mod, family, enums.ActivationType, enums.QuantType, gfx, loaded.get("aiter/fhmoe.py"))
    if fn == "_find_grouped_config":
        return grouped_op_probe(mod, enums.ActivationType, enums.QuantType)
    if fn == "_tuned_bv":
        return gdn_op_probe(mod)
    op_source = None
    if family.aiter_op:  # the file AITER's lookup was compiled from holds the op
        op_source = Path(inspect.unwrap(vars(mod)[fn]).__code__.co_filename).read_text()
    return lookup_probe(vars(mod)[fn], family, tuned_file, flydsl, cpp, op_source)


def compiled_libtype(csrc: Path, family: Any) -> str | None:
    """The libtype the module's gen_instances.py builds its table from (build_tune_dict(..., libtype="ck"))."""
    folder = family.tuner_script.split("/")[1] if family.tuner_script else ""
    gen = csrc / folder / "gen_instances.py"
    m = re.search(r"build_tune_dict(?:_batched)?\((?:[^()]|\([^()]*\))*?libtype=\"(\w+)\"", gen.read_text()) \
        if gen.exists() else None
    return m.group(1) if m else None
