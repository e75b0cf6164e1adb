"""Run AITER's own table code on CPU: resolution and ':'-merge (aiter/jit/core.py), the bf16, a8w8 and fmoe
lookups (tuned_gemm.py, ops/gemm_op_a8w8.py, fused_moe.py), getPaddedM (gemm_common.cu built with g++, called
through ctypes) and ActivationType/QuantType (aiter_enum.h + the bindings in rocm_ops.hpp, built with pybind11).

Only these are stubbed: the hardware (rocminfo's output: the GPU's gfx and CU count; chip_info.py's own code then
reads GPU_ARCHS, CU_NUM and the build targets), FlyDSL importable, the FlyDSL kernel catalog, kernel launchers and
everything that builds or loads GPU code (triton, FlyDSL). A module's top-level statements run one by one,
verbatim; one that raises fails the run (StatementFailed: never skipped), except aiter/jit/core.py's, where a raise
is AITER's own (resolving a table at import), and every name a lookup needs is checked to exist. The sources are
the pinned ROCm/aiter tree (current release) or the amd-aiter 0.1.7 wheel.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import ctypes
import fcntl
import functools
import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import types
from dataclasses import dataclass, field
from pathlib import Path

from workers import engagement_probe as probe

CACHE = Path(__file__).resolve().parents[2] / ".cache" / "aiter-exec"


class Dummy:
    """Whatever a stubbed module hands out: callable, attribute-able, usable as a decorator."""

    def __call__(self, *a, **k):
        return Dummy()

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return Dummy()

    def __mro_entries__(self, bases):
        return (object,)


class StatementFailed(RuntimeError):
    """One of AITER's module statements raised in the harness: the harness no longer runs AITER's code as it is
    (a new import, a new hardware query), so every verdict after it would be a guess. Never skipped."""


class AiterRaised(Exception):
    """What one of AITER's statements raised, as "<Error>: <message>"."""


class NamedDummy(Dummy):
    """A stubbed module's attribute (a kernel launcher such as aiter.ck_moe_stage2_fwd): a Dummy that keeps its
    name, so the MoE op's stage partials can be told apart (TableFamily.moe_op launchers)."""

    def __init__(self, name: str):
        self.__name__ = name


# the LDS bytes per block of each GPU (aiter/ops/flydsl/utils.py:14-24): what sizes FlyDSL's GEMM catalog
LDS_BYTES = {"gfx942": 65536, "gfx950": 163840, "gfx1250": 327680}


def _no_catalog(name):
    raise StatementFailed("this AITER tree has no aiter/ops/flydsl/gemm_kernels.py: its FlyDSL catalog cannot be "
                          "asked (a stub would decide every FlyDSL row)")


class Lazy:
    """A registry entry executed on first use (AITER imports it inside a function, or reads it as an attribute)."""

    def __init__(self, make):
        self.make = make


_GEMM_KERNELS: dict[tuple, types.ModuleType] = {}


def _entry(registry: dict, name: str):
    sub = registry.get(name)
    return sub.make() if isinstance(sub, Lazy) else sub


class StubModule(types.ModuleType):
    def __init__(self, name: str, registry: dict, **attrs):
        super().__init__(name)
        self.__dict__["_registry"] = registry
        self.__dict__["__path__"] = []
        self.__dict__.update(attrs)

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        sub = _entry(self.__dict__["_registry"], f"{self.__name__}.{name}")
        return sub if sub is not None else NamedDummy(name)


# ------------------------------------------------------------------ native pieces (built once, cached)

def _build(src_text: str, name: str, compile_args: list[str]) -> Path:
    digest = hashlib.sha256((src_text + " ".join(compile_args)).encode()).hexdigest()[:16]
    out = CACHE / f"{name}-{digest}.so"
    if out.exists():
        return out
    CACHE.mkdir(parents=True, exist_ok=True)
    src = CACHE / f"{name}-{digest}.cpp"
    src.write_text(src_text)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    subprocess.run(["g++", "-O1", "-shared", "-fPIC", "-std=c++17", str(src), "-o", str(tmp), *compile_args],
                   check=True, capture_output=True, text=True)
    os.replace(tmp, out)
    return out


@functools.lru_cache(maxsize=4)
def padded_m_lib(csrc: str) -> ctypes.CDLL:
    """csrc/py_itfs_cu/gemm_common.cu, compiled as it is (plain C++)."""
    # the body is AITER's; its header is replaced by a C declaration (0.1.7's pulls in torch/extension.h)
    text = (Path(csrc) / "py_itfs_cu" / "gemm_common.cu").read_text().replace('#include "gemm_common.h"', "")
    text = '#include <climits>\nextern "C" int getPaddedM(int M, int N, int K, int gl);\n' + text
    lib = ctypes.CDLL(str(_build(text, "gemm_common", [])))
    lib.getPaddedM.argtypes = [ctypes.c_int] * 4
    lib.getPaddedM.restype = ctypes.c_int
    return lib


def _binding(rocm_ops: str, enum: str) -> str:
    m = re.search(rf"pybind11::enum_<{enum}>\(m, \"{enum}\"\)(.*?)\.export_values\(\);", rocm_ops, re.S)
    if m is None:
        raise RuntimeError(f"no {enum} binding in rocm_ops.hpp")
    body = m.group(0).replace("\\\n", "\n")
    return body


@functools.lru_cache(maxsize=4)
def enums_module(csrc: str) -> types.ModuleType:
    """ActivationType and QuantType as AITER binds them: aiter_enum.h and the enum_/implicitly_convertible lines
    of AITER_CORE_PYBIND (rocm_ops.hpp), compiled with pybind11."""
    import importlib.util

    import pybind11
    inc = Path(csrc) / "include"
    ops = (inc / "rocm_ops.hpp").read_text()
    conv = "\n".join(f"pybind11::implicitly_convertible<int, {e}>();" for e in ("QuantType", "ActivationType")
                     if f"implicitly_convertible<int, {e}>" in ops)
    # one module name per source, so two releases' enums can live in one process
    src = ops + (inc / "aiter_enum.h").read_text() + "namespaced"
    name = "aiter_enums_" + hashlib.sha256(src.encode()).hexdigest()[:12]
    # the header inside a namespace of its own: pybind11 registers a C++ type once per process
    text = (f'#include <pybind11/pybind11.h>\n#include <string>\n#include <cstddef>\n#include <cstdint>\n'
            f'namespace {name} {{\n#include "aiter_enum.h"\n}}\nusing namespace {name};\n'
            f"PYBIND11_MODULE({name}, m) {{\n{_binding(ops, 'QuantType')}\n"
            f"{_binding(ops, 'ActivationType')}\n{conv}\n}}\n")
    ext = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    so = _build(text, name, [f"-I{inc}", f"-I{pybind11.get_include()}", f"-I{sysconfig.get_paths()['include']}"])
    target = so.with_name(name + ext)
    if not target.exists():
        shutil.copy(so, target.with_suffix(".tmp"))
        os.replace(target.with_suffix(".tmp"), target)
    spec = importlib.util.spec_from_file_location(name, target)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ------------------------------------------------------------------ executing AITER's modules

@functools.lru_cache(maxsize=64)
def _statements(path: str) -> list[tuple[int, types.CodeType]]:
    tree = ast.parse(Path(path).read_text(), path)
    return [(node.lineno, compile(ast.Module([node], []), path, "exec")) for node in tree.body]


@dataclass
class Identity:
    gfx: str  # the GPU (what rocminfo reports)
    cu_num: int
    flydsl: bool
    env: dict = field(default_factory=dict)  # GPU_ARCHS / CU_NUM of the serving environment (unset if absent)


def rocminfo_text(gfx: str, cu_num: int) -> str:
    """What rocminfo prints for one GPU agent, as far as chip_info.py reads it."""
    return (f"Agent 1\n  Name: AMD EPYC\n  Device Type: CPU\n  Compute Unit: 96\nAgent 2\n  Name: {gfx}\n"
            f"  Marketing Name: AMD Instinct\n  Device Type: GPU\n  Compute Unit: {cu_num}\n")


class LogCapture(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


class AiterProcess:
    """One fresh 'process' of AITER: its modules executed anew, so every lru_cache and global starts empty."""

    def __init__(self, src: Path, root: Path, ident: Identity, release: str, csrc: Path):
        self.src, self.root, self.ident, self.release = src, root, ident, release
        self.registry: dict[str, types.ModuleType] = {}
        self.log = LogCapture()
        self.logger = logging.getLogger(f"aiter.diff.{id(self)}")
        self.logger.propagate = False
        self.logger.setLevel(logging.INFO)
        self.logger.addHandler(self.log)
        enums = enums_module(str(csrc))
        self.ActivationType, self.QuantType = enums.ActivationType, enums.QuantType
        lib = padded_m_lib(str(csrc))
        self.skipped: dict[str, list[str]] = {}
        reg = self.registry
        for name in ("aiter", "aiter.jit", "aiter.jit.utils", "aiter.ops", "aiter.utility", "aiter.ops.flydsl",
                     "aiter.ops.opus", "aiter.ops.triton", "aiter.ops.triton.utils"):
            reg[name] = StubModule(name, reg)
        for name in ("cpp_extension", "torch_guard", "aiter.jit.utils.torch_guard", "aiter.utility.aiter_types",
                     "aiter.jit.utils.cpp_extension"):
            reg[name] = StubModule(name, reg, torch_compile_guard=lambda *a, **k: (lambda f: f),
                                   aiter_dtypes={}, aiter_tensor_t=Dummy())
        enum_mod = StubModule("aiter.ops.enum", reg, ActivationType=self.ActivationType, QuantType=self.QuantType)
        reg["aiter.ops.enum"] = enum_mod
        # hardware: the FlyDSL package importable, and the LDS per block its GEMM catalog is sized by (the device's;
        # aiter/ops/flydsl/utils.py addressable_lds_bytes_for_gfx)
        reg["aiter.ops.flydsl.utils"] = StubModule(
            "aiter.ops.flydsl.utils", reg, is_flydsl_available=lambda: ident.flydsl,
            get_shared_memory_per_block=lambda device=None, fallback_gfx="": LDS_BYTES.get(ident.gfx, 65536))
        # FlyDSL's GEMM kernel catalog and name parser are AITER's own (aiter/ops/flydsl/gemm_kernels.py, loaded
        # below where the tree has it); a tree without it gets a catalog that refuses to answer (never a stub that
        # knows every name)
        reg["aiter.ops.flydsl.gemm_kernels"] = StubModule(
            "aiter.ops.flydsl.gemm_kernels", reg, get_flydsl_splitk_hgemm_kernel_params=_no_catalog)
        # the FlyDSL MoE kernel catalog: names built as AITER's heuristics ask, every one known
        reg["aiter.ops.flydsl.moe_kernels"] = StubModule(
            "aiter.ops.flydsl.moe_kernels", reg, get_flydsl_kernel_params=lambda name: {"name": name},
            flydsl_kernel_name=lambda stage, *a: f"flydsl_moe{stage}_" + "_".join(map(str, a)),
            pick_flydsl_stage2_tile_k=lambda inter_dim: 128)
        reg["triton"] = StubModule("triton", reg, cdiv=lambda a, b: -(-a // b))  # plain arithmetic the ops use
        reg["flydsl.runtime.device"] = StubModule("flydsl.runtime.device", reg, get_rocm_arch=lambda: ident.gfx)
        reg["flydsl.utils.smem_allocator"] = StubModule("flydsl.utils.smem_allocator", reg, SMEM_CAPACITY_MAP=LDS_BYTES)
        reg["aiter.ops.gemm_op_common"] = StubModule(
            "aiter.ops.gemm_op_common", reg, get_padded_m=lambda M, N, K, gl: lib.getPaddedM(M, N, K, gl))
        # kernel support checks of opus stage-2 kernels are a property of the built kernels: supported
        # and the opus stage-2 catalog: any opus_moe2 name is a built instance (as any flydsl_ name is known)
        reg["aiter.ops.opus.moe_stage2_a8w4"] = StubModule(
            "aiter.ops.opus.moe_stage2_a8w4", reg, cfg_is_supported=lambda *a, **k: (True, ""),
            is_opus_a8w4_stage2_kernel=lambda name: str(name).startswith("opus_moe2"),
            route_bucket_metadata=lambda cfg: {})
        jit = src / "aiter" / "jit"
        utils = jit / "utils"
        if (utils / "build_targets.py").exists():
            self.load("build_targets", utils / "build_targets.py", "")
            reg["aiter.jit.utils.build_targets"] = reg["build_targets"]
        reg["file_baton"] = self.load("aiter.jit.utils.file_baton", utils / "file_baton.py", "aiter.jit.utils")
        chip = self.load("aiter.jit.utils.chip_info", utils / "chip_info.py", "aiter.jit.utils")
        reg["chip_info"] = chip
        # hardware queries: rocminfo's output (chip_info's own code reads GPU_ARCHS, CU_NUM and build targets)
        text = rocminfo_text(ident.gfx, ident.cu_num)
        chip.__dict__["subprocess"] = types.SimpleNamespace(
            run=lambda *a, **k: subprocess.CompletedProcess(a, 0, text, ""), PIPE=subprocess.PIPE,
            CalledProcessError=Exception)
        chip.__dict__["_detect_native"] = lambda: [ident.gfx]
        dt = self.load("aiter.utility.dtypes", src / "aiter" / "utility" / "dtypes.py", "aiter.utility")
        moe_common = src / "aiter" / "ops" / "flydsl" / "moe_common.py"
        if moe_common.exists():  # GateMode, a plain Enum the fhmoe key spells
            self.load("aiter.ops.flydsl.moe_common", moe_common, "aiter.ops.flydsl")
        gemm_kernels = src / "aiter" / "ops" / "flydsl" / "gemm_kernels.py"
        if gemm_kernels.exists():  # the catalog bf16's lookup asks for a FlyDSL row's kernel (tuned_gemm.py:163-177)
            reg["aiter.ops.flydsl.gemm_kernels"] = Lazy(lambda: self._flydsl_gemm_kernels(gemm_kernels))
        mxfp4 = src / "aiter" / "ops" / "flydsl" / "mxfp4_kname.py"
        if mxfp4.exists():  # plain kernel-name parsing the MoE op routes its stages by (fused_moe.py:2468)
            self.load("aiter.ops.flydsl.mxfp4_kname", mxfp4, "aiter.ops.flydsl")
        top = reg["aiter"]
        top.__dict__.update(ActivationType=self.ActivationType, QuantType=self.QuantType, dtypes=dt,
                            logger=self.logger)
        reg["aiter.utility"].__dict__["dtypes"] = dt

    def _flydsl_gemm_kernels(self, path: Path) -> types.ModuleType:
        """aiter/ops/flydsl/gemm_kernels.py executed as it is: its import registers the catalog (_register_all_configs,
        some 80,000 names, ~5 s here), which depends only on the GPU and what get_gfx() answers (GPU_ARCHS); one
        executed module is kept per (tree, GPU, GPU_ARCHS) and handed to each process that imports it."""
        key = (str(path), self.ident.gfx, os.environ.get("GPU_ARCHS"))
        if key not in _GEMM_KERNELS:  # a raise in its registration is AITER's own (get_gfx() on a GPU_ARCHS it
            # rejects): the import raises it, as in the server
            try:
                _GEMM_KERNELS[key] = self.load("aiter.ops.flydsl.gemm_kernels", path, "aiter.ops.flydsl",
                                               own_errors=True)
            except Exception:
                # a failed import leaves no module behind: the next import runs it again (and raises again)
                self.registry["aiter.ops.flydsl.gemm_kernels"] = Lazy(lambda: self._flydsl_gemm_kernels(path))
                raise
        self.registry["aiter.ops.flydsl.gemm_kernels"] = _GEMM_KERNELS[key]
        return _GEMM_KERNELS[key]

    # -- importing
    def _import(self, name, globals=None, locals=None, fromlist=(), level=0):
        if level:
            pkg = (globals or {}).get("__package__") or ""
            parts = pkg.split(".")
            base = ".".join(parts[: len(parts) - level + 1])
            name = f"{base}.{name}" if name else base
        reg = self.registry
        # GPU-only packages are part of the hardware stubbed away: triton, and FlyDSL (its arch query answers the GPU)
        if name in reg or name.split(".")[0] in ("aiter", "triton", "flydsl") or name in ("cpp_extension",
                                                                                         "torch_guard"):
            if name not in reg:
                reg[name] = StubModule(name, reg)
            top = name.split(".")[0]
            if top not in reg:  # `import flydsl.expr as fx` binds the package, then reads its attributes
                reg[top] = StubModule(top, reg)
            _entry(reg, name)
            if fromlist:
                mod = reg[name]
                for f in fromlist:
                    full = f"{name}.{f}"
                    if full in reg:
                        mod.__dict__.setdefault(f, _entry(reg, full))
                return mod
            return reg[name.split(".")[0]]
        return builtins.__import__(name, globals, locals, fromlist, level)

    def import_module(self, name: str) -> types.ModuleType:
        """A module by its dotted name, as the op's own imports find it here (a stub where it is GPU code)."""
        return self._import(name, None, None, ("__name__",), 0)

    def load(self, name: str, path: Path, package: str, upto: str | None = None,
             own_errors: bool = False) -> types.ModuleType:
        """Execute a module's top-level statements one by one (up to the line matching `upto`); own_errors: a
        statement's raise is AITER's (re-raised as it is), not the harness's (StatementFailed)."""
        mod = types.ModuleType(name)
        b = dict(builtins.__dict__, __import__=self._import)
        mod.__dict__.update(__file__=str(self.root / path.relative_to(self.src)), __name__=name,
                            __package__=package, __builtins__=b)
        mod.__dict__["__getattr__"] = lambda attr: Dummy()  # a name a skipped statement would have made
        stop = None
        if upto is not None:
            for i, line in enumerate(path.read_text().splitlines(), 1):
                if re.search(upto, line):
                    stop = i
                    break
        self.registry[name] = mod
        prev = sys.modules.get(name)
        sys.modules[name] = mod  # where @dataclass looks its module up
        try:
            for lineno, code in _statements(str(path)):
                if stop is not None and lineno > stop:
                    break
                try:
                    exec(code, mod.__dict__)
                except Exception as e:  # noqa: BLE001
                    if own_errors:
                        raise
                    if name != "aiter.jit.core":  # core's statements resolve the tables: a raise is AITER's finding
                        raise StatementFailed(f"{path}:{lineno}: {type(e).__name__}: {e}") from e
                    self.skipped.setdefault(name, []).append(f"{lineno}: {type(e).__name__}: {e}")
        finally:
            if prev is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = prev
        return mod

    def module(self, path: str) -> types.ModuleType:
        """An AITER file as a module: 'aiter/ops/gemm_op_a8w8.py' -> aiter.ops.gemm_op_a8w8 (fresh per process)."""
        name = path.removesuffix(".py").replace("/", ".")
        if name in self.registry and not isinstance(self.registry[name], StubModule):
            return self.registry[name]
        return self.load(name, self.src / path, name.rsplit(".", 1)[0])

    def need(self, mod: types.ModuleType, *names: str) -> None:
        missing = [n for n in names if n not in mod.__dict__ or isinstance(mod.__dict__[n], Dummy)]
        if missing:
            raise RuntimeError(f"{mod.__name__}: {missing} not defined; skipped: {self.skipped.get(mod.__name__)}")

    def core(self) -> types.ModuleType:
        if "aiter.jit.core" not in self.registry or isinstance(self.registry["aiter.jit.core"], StubModule):
            core = self.load("aiter.jit.core", self.src / "aiter" / "jit" / "core.py", "aiter.jit",
                             upto=r"^# config_env end here")
            core.__dict__["logger"] = self.logger
        return self.registry["aiter.jit.core"]


# ------------------------------------------------------------------ one deploy, as AITER resolves and looks up

@dataclass
class Outcome:
    error: str | None = None  # what AITER raised while resolving the table
    rewritten: list[str] = field(default_factory=list)  # shipped or overlay files AITER rewrote in place
    resolved: str | None = None
    verdicts: list[tuple[bool, dict | None]] = field(default_factory=list)
    raised: list[str | None] = field(default_factory=list)  # per shape: what AITER raised on it
    lookup_error: str | None = None  # the loader raised (every shape the same error)
    log: list[str] = field(default_factory=list)


_LOCK = Path("/tmp/aiter_configs")


@contextlib.contextmanager
def _env(values: dict[str, str | None]):
    old = {k: os.environ.get(k) for k in values}
    saved_path = list(sys.path)
    try:
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        sys.path[:] = saved_path


def _hashes(root: Path) -> dict[str, str]:
    return {str(p): hashlib.sha1(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*.csv"))}


@contextlib.contextmanager
def _merge_lock():
    """AITER writes merged tables to the fixed /tmp/aiter_configs/<name>.csv: one run at a time on this host."""
    _LOCK.mkdir(parents=True, exist_ok=True)
    with open(_LOCK / ".differential.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def run(src: Path, csrc: Path, release: str, root: Path, family, env_value: str | None, ident: Identity,
        shapes: list[dict]) -> Outcome:
    """Deploy (env value, or None = unset) into the AITER tree at root (root/aiter/configs), then look up each
    shape with AITER's own code, through the same probe workers.verify --engagement runs in the image."""
    out = Outcome()
    before = _hashes(root)
    extra = {"AITER_LOG_TUNED_CONFIG": "1", "GPU_ARCHS": ident.env.get("GPU_ARCHS"), "CU_NUM": ident.env.get("CU_NUM"),
             "AITER_ONLINE_TUNE": None, "AITER_BYPASS_TUNE_CONFIG": None, "AITER_KSPLIT": None,
             # the variables a MoE op reads (MoeOpPath.env): the serving environment's, else unset
             **{k: ident.env.get(k) for k in (family.moe_op.env if family.moe_op else ())}}
    with _merge_lock(), _env({family.env_var: env_value, **extra}):
        p = AiterProcess(src, root, ident, release, csrc)
        try:
            core = p.core()
            if release != "current":  # the old release resolves every table at import: a statement that raised
                # there is AITER's own error ("<line>: <Error>: ..."), reported as AITER raised it
                err = [x for x in p.skipped.get("aiter.jit.core", []) if family.aiter_file_attr in x]
                err = err or p.skipped.get("aiter.jit.core", [])
                if err:
                    raise AiterRaised(err[0].split(": ", 1)[1])
                p.need(core, family.aiter_file_attr)
            # resolve as the server's import does (a module-level AITER_CONFIGS read raises at start), unless the
            # lookup's own module reads the env var itself (grouped_moe_gfx1250.py _load_grouped_config_rows)
            lookup_src = (src / family.aiter_lookup.split(":")[0]).read_text()
            reads_env = re.search(rf"os\.(?:environ\.get|getenv)\(\s*[\"']{family.env_var}[\"']", lookup_src)
            if not (env_value and reads_env):
                out.resolved = probe.resolved_file(core, family.aiter_file_attr)
        except AiterRaised as e:
            out.error = str(e).splitlines()[0]
        except Exception as e:  # noqa: BLE001  AITER raised: the deploy fails at start
            out.error = f"{type(e).__name__}: {str(e).splitlines()[0]}"
        out.rewritten = [k for k, v in _hashes(root).items() if before.get(k) != v]
        if out.error is None:
            try:
                look = probe.make_probe(family, p.module, p, ident.flydsl, ident.gfx, ident.cu_num, csrc,
                                        out.resolved, p.import_module)
                got = [probe.outcome(look, s) for s in shapes]
                out.verdicts, out.raised = [(h, c) for h, c, _ in got], [r for _, _, r in got]
                if shapes and len(set(out.raised)) == 1 and out.raised[0] is not None:
                    raise AiterRaised(out.raised[0])  # the table's loader: the same error whatever the shape
            except probe.ProbeBroken:
                raise
            except AiterRaised as e:
                out.lookup_error = str(e)
            except Exception as e:  # noqa: BLE001  the lookup raised (e.g. a non-unique index)
                out.lookup_error = f"{type(e).__name__}: {str(e).splitlines()[0]}"
        out.log = p.log.lines
    return out
