"""XLA's CPU runtime: read an HLO module, compile it for N replicas, execute it on every rank.

Route through XLA (probed on jax/jaxlib 0.10.2):

1. ``jaxlib._hlo.hlo_module_from_text`` parses (and verifies) the HLO text; the module gives the
   entry parameters and result leaves through ``XlaComputation(proto).program_shape()``.
2. ``jaxlib._jax.mlir.hlo_to_stablehlo`` converts it to StableHLO (XLA's own importer,
   collectives and replica groups included).
3. ``xla_client.make_cpu_client(num_devices=N)``: a CPU client of our own with N devices (no
   ``XLA_FLAGS``, jax's default backend untouched).
4. ``compile_and_load`` with ``num_replicas = n`` (all ranks of all groups), one partition,
   replica i on device i, ``xla_allow_excess_precision=false`` (bf16/f16 ops round as written)
   and LLVM optimisation level 0 (compiles ~3x faster; env ``SHARDPROOF_WITNESS_OPT_LEVEL``).
   Executables are cached by (text, replica count).
5. ``execute_sharded`` runs all ranks at once; the CPU runtime executes the collectives for real
   over the replica groups written in the HLO.

Programs written for partitions (``partition-id``, collectives with a ``channel_id``: what the
SPMD partitioner and ``shard_map`` emit) are mapped to replica flavour, which is exact with one
replica: ``partition-id`` -> ``replica-id``; all-to-all / collective-permute / broadcast drop
their ``channel_id``; all-reduce / all-gather / reduce-scatter with ``channel_id`` and
``use_global_device_ids=true`` stay; with a ``channel_id`` but no ``use_global_device_ids``
(replica-and-partition mode, all partitions with one replica) they drop it and span all ranks.
A program mixing both flavours is rejected as ambiguous.

Mesh replica groups (``replica_groups=mesh['a'=2,'b'=2] {'a'}``, with or without a device order
``device_ids=([2,2]T(1,0))``) are written out as the explicit groups they name (hlo.meshgroups)
before compiling: XLA's HLO -> StableHLO importer (step 2) makes one ``sdy.mesh`` symbol per
set of axis names and drops the device order, so in a module with two meshes (GSPMD writes
``mesh['axis_0'=2,'axis_1'=1,'axis_2'=2]`` for a vocab-sharded gather and
``mesh['axis_0'=1,'axis_1'=1,'axis_2'=2,'axis_3'=2]`` for the softmax over the same vocab), or
with a device order (a collective inside a ``lax.scan``), collectives ran over other groups
than JAX runs them over: correct flax models came out different from JAX on every device.
tests/test_witness_vs_jax.py checks the witness against JAX's own execution.

Channel ids: XLA's verifier refuses two collectives of different shapes on one channel, which
hand-written and cut texts have. A channel id's number is value-neutral (only its presence
matters, see above), so the witness renumbers them, one per instruction — on its own copy of the
text only; the verifier always reads the text as written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import os
import re
import tempfile
import threading
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

_MIN_DEVICES = 8
_OPT_LEVEL = int(os.environ.get("SHARDPROOF_WITNESS_OPT_LEVEL", os.environ.get("SHARDPROOF_ORACLE_OPT_LEVEL", "0")))
_FAST_COMPILE = os.environ.get("SHARDPROOF_WITNESS_FAST_COMPILE", "1") != "0"
_lock = threading.Lock()
_clients: dict[int, Any] = {}


@functools.cache
def xla() -> Any:
    """Import jax/jaxlib once (lazily: ``shardproof check`` pays only when it executes)."""
    import jax  # noqa: F401  (initialises jaxlib)
    from jax._src import core
    from jax._src.lib import _jax, xla_client
    from jax._src.lib import hlo as hlo_lib
    from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding

    return types.SimpleNamespace(
        core=core, jax_ext=_jax, hlo=hlo_lib, xc=xla_client, Mesh=Mesh,
        NamedSharding=NamedSharding, PartitionSpec=PartitionSpec,
        SingleDeviceSharding=SingleDeviceSharding,
    )


def client(n_devices: int) -> Any:
    """A CPU client with at least ``n_devices`` devices (cached per power of two)."""
    size = _MIN_DEVICES
    while size < n_devices:
        size *= 2
    with _lock:
        c = _clients.get(size)
        if c is None:
            c = _clients[size] = xla().xc.make_cpu_client(num_devices=size)
        return c


@dataclasses.dataclass(frozen=True)
class Param:
    number: int
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Program:
    text: str  # the text that is compiled (canonical, replica flavour, channels renumbered)
    params: tuple[Param, ...]  # by parameter number
    results: tuple[tuple[np.dtype, tuple[int, ...]], ...]  # flattened ROOT leaves
    flavour: str  # "replica" or "partition" (as written; compiled as replica)

    def param(self, key: int | str, which: str) -> Param:
        if isinstance(key, bool):
            raise ValueError(f"{which}: bad parameter reference {key!r}")
        if isinstance(key, int):
            if not 0 <= key < len(self.params):
                raise ValueError(f"{which}: no parameter({key}); it has {len(self.params)}")
            return self.params[key]
        name = str(key).lstrip("%")
        for p in self.params:
            if p.name == name:
                return p
        names = ", ".join(p.name for p in self.params)
        raise ValueError(f"{which}: no parameter named {key!r} (parameters: {names})")


_ENTRY_RE = re.compile(r"^ENTRY\s+%?([^\s(]+)", re.MULTILINE)
_PARAM_NUM_RE = re.compile(r"\bparameter\((\d+)\)")
_CHANNEL_RE = re.compile(r"(,\s*channel_id=)\d+")
# A literal the producer printed elided: an unknown value, never executed (XLA would fill it).
ELIDED_LITERAL = re.compile(r"\bconstant\(\{\.\.\.\}\)")
_GLOBAL_GROUP_OPS = {"kAllReduce", "kAllReduceStart", "kAllGather", "kAllGatherStart", "kReduceScatter"}
_PARTITION_WHEN_CHANNEL_OPS = {"kAllToAll", "kRaggedAllToAll", "kCollectivePermute", "kCollectivePermuteStart", "kCollectiveBroadcast"}


# A mesh replica-group list: ``mesh[...] {...}`` or ``mesh[...], device_ids=(...) {...}`` (the
# ids may hold an iota ``[2,2]T(1,0)`` with its own parentheses).
_MESH_GROUPS = re.compile(r"(replica_groups=)(mesh\[[^\]]*\](?:,\s*device_ids=\((?:[^()]|\([^()]*\))*\))?\s*\{[^{}]*\})")


def explicit_mesh_groups(text: str) -> str:
    """Every mesh replica-group list written as its explicit groups (see the module doc);
    iota and explicit lists stay as written (XLA's importer keeps their meaning)."""
    if "replica_groups=mesh[" not in text:
        return text
    from ..hlo.meshgroups import mesh_groups

    def explicit(m: re.Match[str]) -> str:
        groups = mesh_groups(m.group(2))
        return m.group(1) + "{" + ",".join("{" + ",".join(str(d) for d in g) + "}" for g in groups) + "}"

    return _MESH_GROUPS.sub(explicit, text)


def renumber_channels(text: str) -> str:
    """Every ``channel_id`` a number of its own (value-neutral; see the module docstring)."""
    if "channel_id=" not in text:
        return text
    counter = iter(range(1, 1 << 30))
    return _CHANNEL_RE.sub(lambda m: f"{m.group(1)}{next(counter)}", text)


def _opcode(instr: Any) -> str:
    return str(instr.opcode).rsplit(".", 1)[-1]


def _leaves(shape: Any) -> list[Any]:
    if shape.is_tuple():
        out: list[Any] = []
        for s in shape.tuple_shapes():
            out.extend(_leaves(s))
        return out
    return [shape]


def _to_replica_flavour(module: Any, text: str) -> tuple[str, str]:
    """Classify the collectives of ``module``; rewrite a partition-flavoured program."""
    replica_only: list[str] = []
    partition_only: list[str] = []
    edits: dict[str, str] = {}  # instruction name -> kind of edit
    for comp in module.computations():
        for instr in comp.instructions():
            op = _opcode(instr)
            if op == "kReplicaId":
                replica_only.append(instr.name)
            elif op == "kPartitionId":
                partition_only.append(instr.name)
                edits[instr.name] = "partition-id"
            elif op in _PARTITION_WHEN_CHANNEL_OPS:
                if "channel_id=" in instr.to_string():
                    partition_only.append(instr.name)
                    edits[instr.name] = "drop-channel"
                else:
                    replica_only.append(instr.name)
            elif op in _GLOBAL_GROUP_OPS:
                s = instr.to_string()
                if "channel_id=" not in s:
                    replica_only.append(instr.name)
                elif "use_global_device_ids=true" not in s:
                    edits[instr.name] = "all-partitions"
    if not partition_only:
        return text, "replica"
    if replica_only:
        raise ValueError("program mixes cross-replica ops (" + ", ".join(replica_only[:3]) + ") with cross-partition ops (" + ", ".join(partition_only[:3]) + ")")
    lines = text.split("\n")
    for i, line in enumerate(lines):
        m = re.match(r"\s*(?:ROOT\s+)?%?([^\s=]+)\s*=", line)
        if not m or m.group(1) not in edits:
            continue
        kind = edits[m.group(1)]
        if kind == "partition-id":
            line = line.replace("partition-id()", "replica-id()")
        else:
            line = re.sub(r",\s*channel_id=\d+", "", line)
            if kind == "all-partitions":
                line = re.sub(r"replica_groups=(\{\}|\{\{.*?\}\}|\[[^\]]*\]<=\[[^\]]*\](?:T\([^)]*\))?)", "replica_groups={}", line)
        lines[i] = line
    return "\n".join(lines), "partition"


@functools.lru_cache(maxsize=8)
def canonical(text: str) -> str:
    """XLA's own printing of the module (regular form: one instruction per line, names kept)."""
    return module_text(xla().hlo.hlo_module_from_text(renumber_channels(text)))


def module_text(module: Any) -> str:
    """XLA's printing of a parsed module with every literal in full: the default printer writes
    constants of more than 10 elements as ``{...}``, and XLA's parser reads that back as a
    filler, so two programs that differ only in a large constant would run as equal."""
    opts = xla().hlo.HloPrintOptions()
    opts.print_large_constants = True
    return module.to_string(opts)


@functools.lru_cache(maxsize=256)
def read(text: str) -> Program:
    """Parse ``text`` with XLA; its parameters, result leaves and the text to compile."""
    x = xla()
    if ELIDED_LITERAL.search(text):
        raise ValueError("the HLO text has an elided literal constant({...}); its values are unknown, so it cannot be executed")
    module = x.hlo.hlo_module_from_text(renumber_channels(text))
    canon = module_text(module)
    explicit = explicit_mesh_groups(canon)
    if explicit != canon:
        module = x.hlo.hlo_module_from_text(explicit)
    compiled_text, flavour = _to_replica_flavour(module, explicit)
    if compiled_text != canon:
        module = x.hlo.hlo_module_from_text(compiled_text)
    m = _ENTRY_RE.search(canon)
    if m is None:
        raise ValueError("HLO text has no ENTRY computation")
    entry = [c for c in module.computations() if c.name == m.group(1)]
    if len(entry) != 1:
        raise ValueError(f"cannot find the entry computation {m.group(1)!r}")
    names: dict[int, str] = {}
    for instr in entry[0].instructions():
        if _opcode(instr) == "kParameter":
            pm = _PARAM_NUM_RE.search(instr.to_string())
            if pm is not None:
                names[int(pm.group(1))] = instr.name
    pshape = x.xc.XlaComputation(module.as_serialized_hlo_module_proto()).program_shape()
    params: list[Param] = []
    for i, s in enumerate(pshape.parameter_shapes()):
        if s.is_tuple() or s.is_token():
            raise NotImplementedError(f"parameter({i}) is a tuple/token; not supported")
        params.append(Param(i, names.get(i, f"parameter.{i}"), np.dtype(s.numpy_dtype()), tuple(int(d) for d in s.dimensions())))
    results = []
    for s in _leaves(pshape.result_shape()):
        if s.is_token():
            raise NotImplementedError("token results are not supported")
        results.append((np.dtype(s.numpy_dtype()), tuple(int(d) for d in s.dimensions())))
    return Program(compiled_text, tuple(params), tuple(results), flavour)


@functools.lru_cache(maxsize=128)
def compile(text: str, n: int) -> tuple[Any, tuple[Any, ...]]:
    """Compile HLO text for ``n`` replicas on devices 0..n-1 (cached by text and n)."""
    x = xla()
    c = client(n)
    devices = tuple(c.devices()[:n])
    opts = x.xc.CompileOptions()
    opts.num_replicas = n
    opts.num_partitions = 1
    # Round every op to the dtype written (XLA:CPU otherwise keeps bf16/f16 intermediates in
    # f32, which can make a sloppy low-precision pair look exact).
    # The legacy elemental emitter instead of the fusion emitters, and no forced LLVM inlining
    # before module splitting: the same code semantics, compiled ~3x faster (measured on the
    # example pairs: 1.0 s -> 0.35 s per program); the witness's programs are small and run once.
    opts.env_option_overrides = [("xla_allow_excess_precision", False)] + ([("xla_cpu_use_fusion_emitters", False), ("xla_llvm_force_inline_before_split", False)] if _FAST_COMPILE else [])
    debug = opts.executable_build_options.debug_options
    debug.xla_backend_optimization_level = _OPT_LEVEL
    debug.xla_llvm_disable_expensive_passes = _OPT_LEVEL == 0
    opts.device_assignment = x.xc.DeviceAssignment.create(np.arange(n, dtype=np.int32).reshape(n, 1))
    exe = _cached(c, text, n, devices, opts)
    ordered = tuple(exe.local_devices())
    if [d.id for d in ordered] != [d.id for d in devices]:
        raise RuntimeError(f"unexpected device order {ordered} for replicas 0..{n - 1}")
    return exe, devices


def cache_dir() -> Path | None:
    """Where compiled executables are kept across runs (``SHARDPROOF_WITNESS_CACHE``: a folder,
    or ``off``; default ``$XDG_CACHE_HOME/shardproof/witness``). Only this user's own folder is
    used: a serialized executable is code, so nobody else may be able to write it."""
    env = os.environ.get("SHARDPROOF_WITNESS_CACHE", "")
    if env.lower() in ("off", "0", "no", "false"):
        return None
    folder = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "shardproof" / "witness"
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = folder.stat()
        if st.st_uid != os.getuid() or st.st_mode & 0o022:
            return None
    except OSError:
        return None
    return folder


def _cached(c: Any, text: str, n: int, devices: tuple[Any, ...], opts: Any) -> Any:
    """Compile, or load the executable an earlier run compiled from the same text (keyed by the
    text, the replica count, the optimisation level and the jaxlib version)."""
    x = xla()
    import jaxlib

    key = hashlib.sha256(f"{jaxlib.__version__}\n{opts.env_option_overrides}\n{_OPT_LEVEL}\n{n}\n{text}".encode()).hexdigest()
    folder = cache_dir()
    path = folder / f"{key}.xla" if folder else None
    if path is not None and path.is_file():
        try:
            exe = c.deserialize_executable(path.read_bytes(), x.xc.DeviceList(devices), opts)
            with contextlib.suppress(OSError):
                os.utime(path)
            return exe
        except Exception:  # a stale or broken entry: compile again (and overwrite it)
            pass
    module = x.hlo.hlo_module_from_text(text)
    stablehlo = x.jax_ext.mlir.hlo_to_stablehlo(module.as_serialized_hlo_module_proto())
    exe = c.compile_and_load(stablehlo, x.xc.DeviceList(devices), opts)
    if path is not None:
        try:
            data = c.serialize_executable(exe)
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
            _prune_once(path.parent)
        except Exception:  # the cache is an optimisation only
            pass
    return exe


CACHE_CAP_BYTES = 512 << 20


@functools.cache
def _prune_once(folder: Path) -> None:
    """Keep the cache under CACHE_CAP_BYTES: the least recently used entries go (once per
    process, at its first write; a hit refreshes an entry's time)."""
    entries = []
    for e in os.scandir(folder):
        if e.name.endswith(".xla"):
            st = e.stat()
            entries.append((st.st_mtime, st.st_size, e.path))
    total = sum(size for _, size, _ in entries)
    for _, size, path in sorted(entries):
        if total <= CACHE_CAP_BYTES:
            break
        with contextlib.suppress(OSError):
            os.remove(path)
            total -= size


def execute(text: str, args: Sequence[Sequence[np.ndarray]], n: int) -> list[list[np.ndarray]]:
    """Run ``text`` over ``n`` replicas; ``args[p][i]`` is parameter p on replica i. Returns
    ``out[leaf][i]``."""
    x = xla()
    exe, devices = compile(text, n)
    sharding = x.NamedSharding(x.Mesh(np.array(devices), ("r",)), x.PartitionSpec())
    arrays = []
    for per_rank in args:
        first = np.asarray(per_rank[0])
        aval = x.core.ShapedArray(first.shape, first.dtype)
        bufs = [x.xc.batched_device_put(aval, x.SingleDeviceSharding(d), [np.ascontiguousarray(a)], [d], enable_x64=True) for a, d in zip(per_rank, devices, strict=True)]
        arrays.append(x.xc.ArrayImpl(aval, sharding, bufs, True, True))
    results = exe.execute_sharded(arrays).disassemble_into_single_device_arrays()
    return [[np.asarray(r) for r in leaf] for leaf in results]


def check_args(prog: Program, args: Sequence[np.ndarray], who: str) -> None:
    if len(args) != len(prog.params):
        raise ValueError(f"{who}: {len(args)} arguments for {len(prog.params)} parameters")
    for a, p in zip(args, prog.params, strict=True):
        if a.dtype != p.dtype or a.shape != p.shape:
            raise ValueError(f"{who}: parameter({p.number}) {p.name} is {p.dtype}{list(p.shape)}, got {a.dtype}{list(a.shape)}")


def run_hlo(hlo: str, args: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Run a single-device HLO program; returns the ROOT leaves."""
    prog = read(hlo)
    check_args(prog, [np.asarray(a) for a in args], "run_hlo")
    return [leaf[0] for leaf in execute(prog.text, [[np.asarray(a)] for a in args], 1)]


def run_distributed(hlo: str, args: Sequence[Sequence[np.ndarray]]) -> list[list[np.ndarray]]:
    """Run an HLO program on ``len(args)`` replicas at once; ``args[replica][param]``. Returns
    ``out[replica][leaf]``."""
    prog = read(hlo)
    n = len(args)
    for i, rank_args in enumerate(args):
        check_args(prog, [np.asarray(a) for a in rank_args], f"run_distributed[{i}]")
    out = execute(prog.text, [[args[i][p] for i in range(n)] for p in range(len(prog.params))], n)
    return [[leaf[i] for leaf in out] for i in range(n)]
