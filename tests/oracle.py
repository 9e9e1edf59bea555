"""Independent numeric oracle: run a baseline / distributed HLO pair on XLA's own CPU runtime.

The verifier proves a distributed HLO program (the program one rank of an SPMD group runs,
collectives included) equivalent to its single-device baseline.  This module checks the same
claim numerically and *independently*: it never reads op semantics itself, it hands the HLO text
to XLA and compares numbers.

Route through XLA (probed on jax/jaxlib 0.10.2)
------------------------------------------------
1. ``jaxlib._hlo.hlo_module_from_text`` parses (and verifies) the HLO text.  The parsed module
   also gives the entry parameters (number, name, shape, dtype) and the result leaves, via
   ``XlaComputation(proto).program_shape()``, so no regex over the HLO is needed.
2. ``jaxlib._jax.mlir.hlo_to_stablehlo(module.as_serialized_hlo_module_proto())`` converts the
   module to StableHLO bytecode (XLA's own importer, collectives and replica groups included).
3. ``xla_client.make_cpu_client(num_devices=N)`` builds a module-level CPU client of our own with
   N devices.  This needs no ``XLA_FLAGS`` and does not touch jax's default backend, so the
   oracle can live in the same process as tests that import jax for other reasons.
4. ``client.compile_and_load(stablehlo, DeviceList(devices[:n]), CompileOptions)`` with
   ``num_replicas = n`` (the total number of ranks over all groups), ``num_partitions = 1`` and
   the device assignment ``replica i -> device i``, and the debug option
   ``xla_allow_excess_precision=false`` so bf16/f16 ops round as written instead of being kept in
   f32, and LLVM optimisation level 0 (compiles ~3x faster; env
   ``SHARDPROOF_ORACLE_OPT_LEVEL`` overrides).  The baseline is compiled the same way with one
   replica on one device.  Executables are cached by (HLO text, replica count).
5. Each argument is a jax ``ArrayImpl`` assembled from one single-device buffer per rank (each
   rank gets its own data), and ``LoadedExecutable.execute_sharded`` runs all ranks at once.
   The CPU runtime executes the collectives for real (in-process), over the replica groups
   written in the HLO.  ``disassemble_into_single_device_arrays`` gives each rank's outputs.

Programs written for partitions
-------------------------------
XLA's CPU compiler refuses ``num_partitions > 1`` without running the SPMD partitioner, and the
partitioner rejects ``partition-id``.  So a program written in *partition* flavour (what the SPMD
partitioner / ``shard_map`` emit: ``partition-id``, ``all-to-all`` / ``collective-permute`` with
a ``channel_id``) is mapped to replica flavour before compiling, which is exact when there is a
single replica:

* ``partition-id()`` -> ``replica-id()``;
* all-to-all / collective-permute / collective-broadcast / ragged-all-to-all: drop
  ``channel_id`` (cross-partition -> cross-replica, same ids);
* all-reduce / all-gather / reduce-scatter with ``channel_id`` and
  ``use_global_device_ids=true``: unchanged (flattened ids == replica ids);
* the same with ``channel_id`` but no ``use_global_device_ids`` (replica-and-partition mode,
  which with one replica spans all partitions): drop ``channel_id``, ``replica_groups={}``.

A program that mixes cross-replica collectives (no ``channel_id``) or ``replica-id`` with
partition-flavoured ones is rejected as ambiguous.

The relations contract (``relations``: the parsed YAML)
-------------------------------------------------------
``groups``: list of rank groups; the union must be ``0..N-1`` (N = num_replicas).  Rank ``r`` of
a group is its position in the list; ``c`` is the group size.  Every group runs the same
distributed program against the same baseline inputs.

``inputs`` entries (parameter number, or parameter name with or without ``%``):

* ``duplicate``: every rank gets the whole baseline input;
* ``sharded`` (``dim``, optional ``blocks``): rank r gets the r-th of c equal pieces along
  ``dim``; with ``blocks`` the dim is a concatenation of blocks of those sizes and rank r gets
  the r-th piece of each block, concatenated in block order;
* ``rank`` (distributed only): integer scalar holding the rank's index in its group;
* ``partial`` (optional ``op``: ``add`` (default) or ``max``): rank r gets a random piece and
  the baseline input is the sum (max) of the pieces.  Float pieces are multiples of 1/8 so the
  sum is exact in f32/f16/bf16 for moderate magnitudes.

Optional ``int_range: [lo, hi]`` on an integer input (default ``[0, 8)``, hi exclusive).

``outputs`` entries (index of the leaf in the ROOT result; 0 when ROOT is not a tuple; nested
tuples are flattened depth-first, which equals the ROOT tuple index for a flat tuple):

* ``duplicate``: each rank's output equals the baseline output;
* ``sharded`` (``dim``, optional ``blocks``): rank r's output is the r-th piece of the baseline;
* ``partial`` (optional ``op``: ``add``/``max``): the sum (max) over a group's ranks equals it.

Optional ``rtol`` / ``atol`` on an output entry override the dtype defaults.

Random inputs: floats ~ N(0, 1) in the parameter dtype, integers uniform in ``int_range``,
pred uniform bools, complex with N(0, 1) real and imaginary parts.

Tolerances: element-wise ``|d - b| <= atol * scale + rtol * |b|`` with ``scale =
max(1, max|baseline output|)``; defaults f64 1e-9, f32 1e-4, f16 5e-3, bf16 2e-2, f8 0.25 (rtol
and atol alike).  Integers and pred must match exactly.  NaN matches NaN at the same position.
``max_rel_diff`` is ``max |d - b| / max(|b|, atol * scale)``.

Limitations
-----------
* Input must be HLO that XLA:CPU compiles from scratch: pre-optimisation dumps (torch-xla
  ``*.before_optimizations.txt``, ``jax ... .as_text(dialect="hlo")``) work; post-optimisation
  dumps of another backend (fusions with backend configs, target-specific custom-calls such as
  cuBLAS / oneDNN / Triton) do not compile.
* ``collective-broadcast`` (and anything else XLA:CPU's thunk emitter lacks) is not executable
  on CPU; ``send`` / ``recv`` and host transfers are not supported.
* Tuple or token entry parameters are not supported; ROOT leaves are addressed flattened.
* Random inputs are N(0, 1) / small integers: programs whose correctness depends on input
  ranges (e.g. gathers with offsets, masks) need ``int_range`` set per input.
* Comparisons are numeric at one seed (use several seeds for confidence); rounding differences
  between the two orders of summation are absorbed by the tolerances above.

Command line: ``python tests/oracle.py BASELINE.hlo DISTRIBUTED.hlo RELATIONS.yaml [--seed N]``
prints the comparison and exits 0 when the pair is equal, 1 otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import re
import sys
import threading
import time
import types
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["OutputCheck", "PairResult", "run_distributed", "run_hlo", "run_pair"]


# --------------------------------------------------------------------------------------------
# XLA access (lazy: importing this module does not import jax)
# --------------------------------------------------------------------------------------------

_MIN_DEVICES = 8
# LLVM optimisation level of the CPU backend: 0 compiles small test programs ~3x faster; raise
# it (SHARDPROOF_ORACLE_OPT_LEVEL=2) for big programs, where run time dominates.
_BACKEND_OPT_LEVEL = int(os.environ.get("SHARDPROOF_ORACLE_OPT_LEVEL", "0"))
_lock = threading.Lock()
_clients: dict[int, Any] = {}


@functools.cache
def _xla() -> Any:
    """Import jax/jaxlib once and return a namespace with what the oracle uses."""
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


def _client(n_devices: int) -> Any:
    """A module-level CPU client with at least ``n_devices`` devices (cached)."""
    size = _MIN_DEVICES
    while size < n_devices:
        size *= 2
    with _lock:
        client = _clients.get(size)
        if client is None:
            client = _xla().xc.make_cpu_client(num_devices=size)
            _clients[size] = client
        return client


# --------------------------------------------------------------------------------------------
# Reading an HLO module
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Param:
    number: int
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class _Program:
    text: str  # the text that is compiled (canonical; replica flavour)
    params: tuple[_Param, ...]  # by parameter number
    results: tuple[tuple[np.dtype, tuple[int, ...]], ...]  # flattened ROOT leaves
    flavour: str  # "replica" or "partition" (as written; compiled as replica)

    def param(self, key: int | str, which: str) -> _Param:
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

_GLOBAL_GROUP_OPS = {"kAllReduce", "kAllReduceStart", "kAllGather", "kAllGatherStart",
                     "kReduceScatter"}
_PARTITION_WHEN_CHANNEL_OPS = {"kAllToAll", "kRaggedAllToAll", "kCollectivePermute",
                               "kCollectivePermuteStart", "kCollectiveBroadcast"}


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
    replica_only: list[str] = []  # instructions meaningful only with replicas
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
        raise ValueError(
            "program mixes cross-replica ops (" + ", ".join(replica_only[:3]) + ") with "
            "cross-partition ops (" + ", ".join(partition_only[:3]) + ")"
        )
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
                line = re.sub(
                    r"replica_groups=(\{\}|\{\{.*?\}\}|\[[^\]]*\]<=\[[^\]]*\](?:T\([^)]*\))?)",
                    "replica_groups={}",
                    line,
                )
        lines[i] = line
    return "\n".join(lines), "partition"


@functools.lru_cache(maxsize=256)
def _read(text: str) -> _Program:
    xla = _xla()
    module = xla.hlo.hlo_module_from_text(text)
    canonical = module.to_string()
    compiled_text, flavour = _to_replica_flavour(module, canonical)
    if compiled_text != canonical:
        module = xla.hlo.hlo_module_from_text(compiled_text)
    m = _ENTRY_RE.search(canonical)
    if m is None:
        raise ValueError("HLO text has no ENTRY computation")
    entry_name = m.group(1)
    entry = [c for c in module.computations() if c.name == entry_name]
    if len(entry) != 1:
        raise ValueError(f"cannot find the entry computation {entry_name!r}")
    names: dict[int, str] = {}
    for instr in entry[0].instructions():
        if _opcode(instr) == "kParameter":
            pm = _PARAM_NUM_RE.search(instr.to_string())
            if pm is not None:
                names[int(pm.group(1))] = instr.name
    pshape = xla.xc.XlaComputation(module.as_serialized_hlo_module_proto()).program_shape()
    params: list[_Param] = []
    for i, s in enumerate(pshape.parameter_shapes()):
        if s.is_tuple() or s.is_token():
            raise NotImplementedError(f"parameter({i}) is a tuple/token; not supported")
        params.append(_Param(i, names.get(i, f"parameter.{i}"), np.dtype(s.numpy_dtype()),
                             tuple(int(d) for d in s.dimensions())))
    results = []
    for s in _leaves(pshape.result_shape()):
        if s.is_token():
            raise NotImplementedError("token results are not supported")
        results.append((np.dtype(s.numpy_dtype()), tuple(int(d) for d in s.dimensions())))
    return _Program(compiled_text, tuple(params), tuple(results), flavour)


@functools.lru_cache(maxsize=256)
def _compile(text: str, n: int) -> tuple[Any, tuple[Any, ...]]:
    """Compile HLO text for ``n`` replicas on devices 0..n-1 of the oracle's client."""
    xla = _xla()
    module = xla.hlo.hlo_module_from_text(text)
    stablehlo = xla.jax_ext.mlir.hlo_to_stablehlo(module.as_serialized_hlo_module_proto())
    client = _client(n)
    devices = tuple(client.devices()[:n])
    opts = xla.xc.CompileOptions()
    opts.num_replicas = n
    opts.num_partitions = 1
    # Round every op to the dtype written in the HLO (XLA:CPU otherwise keeps bf16/f16
    # intermediates in f32, which can make a sloppy low-precision pair look exact).
    opts.env_option_overrides = [("xla_allow_excess_precision", False)]
    debug = opts.executable_build_options.debug_options
    debug.xla_backend_optimization_level = _BACKEND_OPT_LEVEL
    debug.xla_llvm_disable_expensive_passes = _BACKEND_OPT_LEVEL == 0
    opts.device_assignment = xla.xc.DeviceAssignment.create(
        np.arange(n, dtype=np.int32).reshape(n, 1)
    )
    exe = client.compile_and_load(stablehlo, xla.xc.DeviceList(devices), opts)
    ordered = tuple(exe.local_devices())
    if [d.id for d in ordered] != [d.id for d in devices]:
        raise RuntimeError(f"unexpected device order {ordered} for replicas 0..{n - 1}")
    return exe, devices


def _execute(text: str, args: Sequence[Sequence[np.ndarray]], n: int) -> list[list[np.ndarray]]:
    """Run ``text`` over ``n`` replicas; ``args[p][i]`` is parameter p on replica i.

    Returns ``out[leaf][i]``.
    """
    xla = _xla()
    exe, devices = _compile(text, n)
    sharding = xla.NamedSharding(xla.Mesh(np.array(devices), ("r",)), xla.PartitionSpec())
    arrays = []
    for per_rank in args:
        first = np.asarray(per_rank[0])
        aval = xla.core.ShapedArray(first.shape, first.dtype)
        bufs = [
            xla.xc.batched_device_put(aval, xla.SingleDeviceSharding(d),
                                      [np.ascontiguousarray(a)], [d], enable_x64=True)
            for a, d in zip(per_rank, devices, strict=True)
        ]
        arrays.append(xla.xc.ArrayImpl(aval, sharding, bufs, True, True))
    results = exe.execute_sharded(arrays).disassemble_into_single_device_arrays()
    return [[np.asarray(x) for x in leaf] for leaf in results]


def _check_args(prog: _Program, args: Sequence[np.ndarray], who: str) -> None:
    if len(args) != len(prog.params):
        raise ValueError(f"{who}: {len(args)} arguments for {len(prog.params)} parameters")
    for a, p in zip(args, prog.params, strict=True):
        if a.dtype != p.dtype or a.shape != p.shape:
            raise ValueError(f"{who}: parameter({p.number}) {p.name} is {p.dtype}{list(p.shape)}"
                             f", got {a.dtype}{list(a.shape)}")


def run_hlo(hlo: str, args: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Run a single-device HLO program on XLA's CPU runtime; returns the ROOT leaves."""
    prog = _read(hlo)
    _check_args(prog, [np.asarray(a) for a in args], "run_hlo")
    out = _execute(prog.text, [[np.asarray(a)] for a in args], 1)
    return [leaf[0] for leaf in out]


def run_distributed(hlo: str, args: Sequence[Sequence[np.ndarray]]) -> list[list[np.ndarray]]:
    """Run an HLO program on ``len(args)`` replicas at once; ``args[replica][param]``.

    Returns ``out[replica][leaf]``.
    """
    prog = _read(hlo)
    n = len(args)
    for i, rank_args in enumerate(args):
        _check_args(prog, [np.asarray(a) for a in rank_args], f"run_distributed[{i}]")
    per_param = [[args[i][p] for i in range(n)] for p in range(len(prog.params))]
    out = _execute(prog.text, per_param, n)
    return [[leaf[i] for leaf in out] for i in range(n)]


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------


def _is_float(dt: np.dtype) -> bool:
    if dt.kind == "f":
        return True
    if dt.kind == "V":  # ml_dtypes: bfloat16, float8_*, ...
        import ml_dtypes

        try:
            ml_dtypes.finfo(dt)
        except ValueError:
            return False
        return True
    return False


def _random(rng: np.random.Generator, p: _Param, entry: dict[str, Any]) -> np.ndarray:
    dt, shape = p.dtype, p.shape
    if _is_float(dt):
        return rng.standard_normal(shape).astype(dt)
    if dt.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt)
    if dt.kind in "iu":
        lo, hi = entry.get("int_range", [0, 8])
        return rng.integers(int(lo), int(hi), size=shape).astype(dt)
    if dt.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    raise NotImplementedError(f"cannot generate inputs of dtype {dt}")


def _norm_dim(dim: Any, ndim: int, what: str) -> int:
    if not isinstance(dim, int) or isinstance(dim, bool) or not -ndim <= dim < ndim:
        raise ValueError(f"{what}: bad dim {dim!r} for rank-{ndim} array")
    return dim % ndim


def _split(x: np.ndarray, dim: int, c: int, blocks: Sequence[int] | None,
           what: str) -> list[np.ndarray]:
    """Rank r's piece for r in 0..c-1 (equal pieces, or per-block pieces)."""
    size = x.shape[dim]
    if blocks is None:
        blocks = [size]
    blocks = [int(b) for b in blocks]
    if sum(blocks) != size:
        raise ValueError(f"{what}: blocks {blocks} do not add up to dim {dim} size {size}")
    for b in blocks:
        if b % c:
            raise ValueError(f"{what}: size {b} along dim {dim} is not divisible by {c}")
    pieces: list[list[np.ndarray]] = [[] for _ in range(c)]
    start = 0
    for b in blocks:
        step = b // c
        for r in range(c):
            idx = [slice(None)] * x.ndim
            idx[dim] = slice(start + r * step, start + (r + 1) * step)
            pieces[r].append(x[tuple(idx)])
        start += b
    return [np.concatenate(p, axis=dim) if len(p) > 1 else p[0] for p in pieces]


def _partial_pieces(rng: np.random.Generator, base: np.ndarray, c: int,
                    op: str) -> list[np.ndarray]:
    dt = base.dtype
    if dt.kind == "b":
        raise NotImplementedError("partial relation on pred inputs")
    if op == "max":
        exact = base.astype(np.float64) if _is_float(dt) or dt.kind == "c" else base
        owner = rng.integers(0, c, size=base.shape)
        pieces = []
        for r in range(c):
            if _is_float(dt):
                low = (exact - np.abs(rng.standard_normal(base.shape))).astype(dt)
            else:
                low = base - rng.integers(0, 2, size=base.shape).astype(dt)
                low = np.where(low > base, base, low)  # unsigned wrap-around at 0
            pieces.append(np.where(owner == r, base, low).astype(dt))
        return pieces
    if op != "add":
        raise ValueError(f"unknown partial op {op!r} (add, max)")
    if _is_float(dt) or dt.kind == "c":
        def grid(shape: tuple[int, ...]) -> np.ndarray:
            v = np.round(rng.standard_normal(shape) * 8) / 8
            if dt.kind == "c":
                v = v + 1j * np.round(rng.standard_normal(shape) * 8) / 8
            return v

        others = [grid(base.shape) for _ in range(c - 1)]
        wide = base.astype(np.complex128 if dt.kind == "c" else np.float64)
        last = wide - sum(others, np.zeros_like(wide))
        return [o.astype(dt) for o in others] + [last.astype(dt)]
    others = [rng.integers(-4, 4, size=base.shape).astype(dt) for _ in range(c - 1)]
    last = base.copy()
    with np.errstate(over="ignore"):
        for o in others:
            last = (last - o).astype(dt)
    return [*others, last]


def _grid_input(rng: np.random.Generator, p: _Param) -> np.ndarray:
    """A float baseline input on the 1/8 grid (for partial inputs: exact piece sums)."""
    v = np.round(rng.standard_normal(p.shape) * 8) / 8
    if p.dtype.kind == "c":
        v = v + 1j * np.round(rng.standard_normal(p.shape) * 8) / 8
    return v.astype(p.dtype)


# --------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class OutputCheck:
    """The comparison of one output entry of the relations, over every rank of every group."""

    baseline: int
    distributed: int
    relation: str
    dtype: str
    max_abs_diff: float
    max_rel_diff: float
    allclose: bool
    rtol: float
    atol: float  # effective (already scaled by the baseline's magnitude)
    # (group index, rank) of the largest difference; rank -1: a partial output's reduction
    worst: tuple[int, int] | None = None
    note: str = ""

    def line(self) -> str:
        where = f" worst group {self.worst[0]} rank {self.worst[1]}" if self.worst else ""
        verdict = "ok" if self.allclose else "MISMATCH"
        note = f" ({self.note})" if self.note else ""
        return (f"out b{self.baseline}/d{self.distributed} {self.relation:9s} {self.dtype:8s} "
                f"max_abs {self.max_abs_diff:.3g} max_rel {self.max_rel_diff:.3g} "
                f"[rtol {self.rtol:g} atol {self.atol:.3g}] {verdict}{where}{note}")


@dataclasses.dataclass
class PairResult:
    """Outcome of :func:`run_pair`."""

    outputs: list[OutputCheck]
    equal: bool
    flavour: str  # "replica", or "partition" (rewritten to replicas, see module docstring)
    seconds: float
    baseline_outputs: list[np.ndarray] = dataclasses.field(repr=False, default_factory=list)
    # distributed_outputs[replica][leaf], replica = global id (position in the flattened groups)
    distributed_outputs: list[list[np.ndarray]] = dataclasses.field(repr=False,
                                                                    default_factory=list)

    def summary(self) -> str:
        head = f"{'EQUAL' if self.equal else 'NOT EQUAL'} ({self.flavour}, {self.seconds:.3f}s)"
        return "\n".join([head, *("  " + o.line() for o in self.outputs)])

    def __bool__(self) -> bool:
        return self.equal


_TOLERANCES: dict[str, float] = {
    "float64": 1e-9, "float32": 1e-4, "float16": 5e-3, "bfloat16": 2e-2,
    "complex128": 1e-9, "complex64": 1e-4,
}


def _default_tol(dt: np.dtype) -> float:
    if dt.name in _TOLERANCES:
        return _TOLERANCES[dt.name]
    if dt.name.startswith("float8") or dt.name.startswith("float4") or dt.name.startswith(
        "float6"
    ):
        return 0.25
    return 0.0


def _compare(actual: np.ndarray, expected: np.ndarray, rtol: float,
             atol: float) -> tuple[float, float, bool]:
    """(max abs diff, max rel diff, allclose) of two arrays of the same shape."""
    if expected.size == 0:
        return 0.0, 0.0, True
    if expected.dtype.kind in "biu":
        a = actual.astype(np.float64)
        e = expected.astype(np.float64)
        diff = np.abs(a - e)
        ok = bool(np.array_equal(actual, expected))
        return float(diff.max()), float((diff / np.maximum(np.abs(e), 1.0)).max()), ok
    wide = np.complex128 if expected.dtype.kind == "c" or actual.dtype.kind == "c" else np.float64
    a = actual.astype(wide)
    e = expected.astype(wide)
    both_nan = np.isnan(a) & np.isnan(e)
    same = (a == e) | both_nan  # also infinities of the same sign
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.where(same, 0.0, np.abs(a - e))
    diff = np.where(np.isnan(diff), np.inf, diff)
    floor = max(atol, np.finfo(np.float64).tiny)
    rel = diff / np.maximum(np.abs(np.where(np.isfinite(e), e, 0.0)), floor)
    ok = diff <= atol + rtol * np.abs(np.where(np.isfinite(e), e, 0.0))
    return float(diff.max()), float(rel.max()), bool(ok.all())


def _scale(x: np.ndarray) -> float:
    if x.size == 0 or x.dtype.kind in "biu":
        return 1.0
    v = np.abs(x.astype(np.complex128 if x.dtype.kind == "c" else np.float64))
    v = v[np.isfinite(v)]
    return max(1.0, float(v.max())) if v.size else 1.0


# --------------------------------------------------------------------------------------------
# run_pair
# --------------------------------------------------------------------------------------------


def _groups(relations: dict[str, Any]) -> list[list[int]]:
    groups = relations.get("groups")
    if not groups or not all(isinstance(g, list | tuple) and g for g in groups):
        raise ValueError("relations: 'groups' must be a non-empty list of non-empty rank lists")
    groups = [[int(x) for x in g] for g in groups]
    flat = sorted(x for g in groups for x in g)
    if flat != list(range(len(flat))):
        raise ValueError(f"relations: groups {groups} must cover ranks 0..{len(flat) - 1} once")
    return groups


def run_pair(baseline_hlo: str, distributed_hlo: str, relations: dict[str, Any],
             seed: int = 0) -> PairResult:
    """Run the baseline on one device and the distributed program over all ranks; compare.

    See the module docstring for the ``relations`` contract.
    """
    t0 = time.perf_counter()
    base = _read(baseline_hlo)
    dist = _read(distributed_hlo)
    groups = _groups(relations)
    n = sum(len(g) for g in groups)
    rng = np.random.default_rng(seed)

    in_entries = list(relations.get("inputs") or [])
    out_entries = list(relations.get("outputs") or [])
    if not out_entries:
        raise ValueError("relations: no outputs to compare")

    # Which baseline parameter feeds each entry; generate the baseline inputs.
    base_of: dict[int, int] = {}
    for k, e in enumerate(in_entries):
        rel = e.get("relation")
        if rel not in ("duplicate", "sharded", "rank", "partial", "token"):
            raise ValueError(f"inputs[{k}]: unknown relation {rel!r}")
        if rel not in ("rank", "token"):
            if "baseline" not in e:
                raise ValueError(f"inputs[{k}]: relation {rel} needs a baseline parameter")
            bp = base.param(e["baseline"], f"inputs[{k}].baseline")
            if bp.number in base_of.values():
                raise ValueError(f"inputs[{k}]: baseline parameter {bp.number} listed twice")
            base_of[k] = bp.number
    missing = sorted(set(range(len(base.params))) - set(base_of.values()))
    if missing:
        raise ValueError(f"relations: baseline parameters {missing} have no input entry")
    base_args: list[np.ndarray | None] = [None] * len(base.params)
    for k, e in enumerate(in_entries):
        if k in base_of:
            bp = base.params[base_of[k]]
            fl = _is_float(bp.dtype) or bp.dtype.kind == "c"
            grid = e.get("relation") == "partial" and e.get("op", "add") == "add" and fl
            base_args[bp.number] = _grid_input(rng, bp) if grid else _random(rng, bp, e)

    # Distributed inputs, per global replica id.
    dist_args: list[list[np.ndarray | None]] = [[None] * len(dist.params) for _ in range(n)]
    seen: set[int] = set()
    for k, e in enumerate(in_entries):
        if "distributed" not in e:
            raise ValueError(f"inputs[{k}]: no distributed parameter")
        dp = dist.param(e["distributed"], f"inputs[{k}].distributed")
        if dp.number in seen:
            raise ValueError(f"inputs[{k}]: distributed parameter {dp.number} listed twice")
        seen.add(dp.number)
        rel = e["relation"]
        for g in groups:
            c = len(g)
            if rel == "rank":
                if dp.shape != () or dp.dtype.kind not in "iu":
                    raise ValueError(f"inputs[{k}]: rank parameter must be an integer scalar, "
                                     f"got {dp.dtype}{list(dp.shape)}")
                pieces = [np.array(r, dtype=dp.dtype) for r in range(c)]
            elif rel == "token":
                # torch-xla's collective token holds 0 at program start.
                pieces = [np.zeros(dp.shape, dtype=dp.dtype)] * c
            else:
                x = base_args[base_of[k]]
                assert x is not None
                if rel == "duplicate":
                    pieces = [x] * c
                elif rel == "sharded":
                    dim = _norm_dim(e.get("dim"), x.ndim, f"inputs[{k}]")
                    pieces = _split(x, dim, c, e.get("blocks"), f"inputs[{k}]")
                else:
                    pieces = _partial_pieces(rng, x, c, str(e.get("op", "add")))
            for r, gid in enumerate(g):
                piece = pieces[r]
                if piece.dtype != dp.dtype or piece.shape != dp.shape:
                    raise ValueError(
                        f"inputs[{k}] ({rel}): rank {r} would get {piece.dtype}{list(piece.shape)}"
                        f" but distributed parameter {dp.number} ({dp.name}) is "
                        f"{dp.dtype}{list(dp.shape)}"
                    )
                dist_args[gid][dp.number] = piece
    missing = [p.number for p in dist.params if dist_args[0][p.number] is None]
    if missing:
        raise ValueError(f"relations: distributed parameters {missing} have no input entry")

    base_out = [leaf[0] for leaf in _execute(base.text, [[a] for a in base_args], 1)]
    per_param = [[dist_args[i][p] for i in range(n)] for p in range(len(dist.params))]
    dist_leaves = _execute(dist.text, per_param, n)  # [leaf][replica]

    checks = [
        _check_output(k, e, base, dist, base_out, dist_leaves, groups)
        for k, e in enumerate(out_entries)
    ]
    return PairResult(
        outputs=checks,
        equal=all(c.allclose for c in checks),
        flavour=dist.flavour,
        seconds=time.perf_counter() - t0,
        baseline_outputs=base_out,
        distributed_outputs=[[leaf[i] for leaf in dist_leaves] for i in range(n)],
    )


def _check_output(k: int, e: dict[str, Any], base: _Program, dist: _Program,
                  base_out: list[np.ndarray], dist_leaves: list[list[np.ndarray]],
                  groups: list[list[int]]) -> OutputCheck:
    rel = e.get("relation")
    if rel not in ("duplicate", "sharded", "partial"):
        raise ValueError(f"outputs[{k}]: unknown relation {rel!r}")
    bi, di = e.get("baseline"), e.get("distributed")
    for what, idx, count in (("baseline", bi, len(base.results)),
                             ("distributed", di, len(dist.results))):
        if not isinstance(idx, int) or isinstance(idx, bool) or not 0 <= idx < count:
            raise ValueError(f"outputs[{k}].{what}: bad output index {idx!r} ({count} outputs)")
    assert isinstance(bi, int) and isinstance(di, int)
    expected_full = base_out[bi]
    dt = expected_full.dtype
    tol = _default_tol(dt)
    rtol = float(e.get("rtol", tol))
    atol = float(e.get("atol", tol)) * _scale(expected_full)
    check = OutputCheck(bi, di, str(rel), dt.name, 0.0, 0.0, True, rtol, atol)

    def record(actual: np.ndarray, expected: np.ndarray, where: tuple[int, int] | None) -> None:
        if actual.shape != expected.shape or actual.dtype != expected.dtype:
            check.allclose = False
            check.max_abs_diff = check.max_rel_diff = float("inf")
            check.worst = where
            check.note = (f"distributed gives {actual.dtype}{list(actual.shape)}, "
                          f"expected {expected.dtype}{list(expected.shape)}")
            return
        mad, mrd, ok = _compare(actual, expected, rtol, atol)
        if mad > check.max_abs_diff or (not ok and check.allclose):
            check.worst = where
        check.max_abs_diff = max(check.max_abs_diff, mad)
        check.max_rel_diff = max(check.max_rel_diff, mrd)
        check.allclose = check.allclose and ok

    for gi, g in enumerate(groups):
        c = len(g)
        outs = [dist_leaves[di][gid] for gid in g]
        if rel == "duplicate":
            for r in range(c):
                record(outs[r], expected_full, (gi, r))
        elif rel == "sharded":
            dim = _norm_dim(e.get("dim"), expected_full.ndim, f"outputs[{k}]")
            pieces = _split(expected_full, dim, c, e.get("blocks"), f"outputs[{k}]")
            for r in range(c):
                record(outs[r], pieces[r], (gi, r))
        else:
            op = str(e.get("op", "add"))
            if any(o.shape != expected_full.shape or o.dtype != dt for o in outs):
                bad = next(r for r, o in enumerate(outs)
                           if o.shape != expected_full.shape or o.dtype != dt)
                record(outs[bad], expected_full, (gi, bad))
                continue
            if op == "add":
                if dt.kind in "iub":
                    total = np.sum(np.stack(outs), axis=0, dtype=dt if dt.kind != "b" else None)
                else:
                    wide = np.complex128 if dt.kind == "c" else np.float64
                    total = np.sum(np.stack([o.astype(wide) for o in outs]), axis=0)
            elif op == "max":
                total = np.max(np.stack(outs), axis=0)
            else:
                raise ValueError(f"outputs[{k}]: unknown partial op {op!r} (add, max)")
            if dt.kind == "b":
                total = total.astype(bool)
            mad, mrd, ok = _compare(total, expected_full, rtol, atol)
            if mad > check.max_abs_diff or (not ok and check.allclose):
                check.worst = (gi, -1)
            check.max_abs_diff = max(check.max_abs_diff, mad)
            check.max_rel_diff = max(check.max_rel_diff, mrd)
            check.allclose = check.allclose and ok
    return check


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    import yaml

    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("baseline", help="baseline HLO text file")
    ap.add_argument("distributed", help="distributed HLO text file")
    ap.add_argument("relations", help="relations YAML file")
    ap.add_argument("--seed", type=int, default=0)
    ns = ap.parse_args(argv)
    with open(ns.baseline) as f:
        baseline = f.read()
    with open(ns.distributed) as f:
        distributed = f.read()
    with open(ns.relations) as f:
        relations = yaml.safe_load(f)
    result = run_pair(baseline, distributed, relations, seed=ns.seed)
    print(result.summary())
    return 0 if result.equal else 1


if __name__ == "__main__":
    sys.exit(main())
