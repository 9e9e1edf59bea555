"""The one IR every stage shares: an HLO module as plain dataclasses.

The parser fills it, the normalizer rewrites it (functions returning new modules), the analysis
reads it, and the report quotes it. Attributes are kept in two forms: ``attrs`` holds the raw text
of every ``key=value`` pair exactly as printed (nothing is lost), ``parsed`` holds the typed
reading of the keys the engine understands (dimensions, slice, dot numbers, replica groups, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Element types of XLA's PrimitiveType, as printed in HLO text.
ELEMENT_TYPES = frozenset(
    {
        "pred", "s2", "s4", "s8", "s16", "s32", "s64", "u2", "u4", "u8", "u16", "u32", "u64",
        "f16", "f32", "f64", "bf16", "c64", "c128", "f8e5m2", "f8e4m3fn", "f8e4m3b11fnuz",
        "f8e5m2fnuz", "f8e4m3fnuz", "f8e4m3", "f8e3m4", "f8e8m0fnu", "f4e2m1fn",
        "token", "opaque",
    }
)  # fmt: skip


@dataclass(frozen=True)
class Shape:
    """An array shape ``f32[4,8]{1,0}``, a tuple ``(f32[2], s32[])``, a token or opaque."""

    dtype: str  # element type, or "tuple"
    dims: tuple[int, ...] = ()
    layout: str | None = None  # minor-to-major text inside {...}, kept verbatim
    tuple_shapes: tuple[Shape, ...] = ()
    dynamic: tuple[bool, ...] = ()  # per dim: printed as <=N (bounded dynamic)

    @property
    def is_tuple(self) -> bool:
        return self.dtype == "tuple"

    @property
    def rank(self) -> int:
        return len(self.dims)

    @property
    def numel(self) -> int:
        n = 1
        for d in self.dims:
            n *= d
        return n

    def __str__(self) -> str:
        if self.is_tuple:
            return "(" + ", ".join(str(s) for s in self.tuple_shapes) + ")"
        if self.dtype in ("token", "opaque") and not self.dims:
            return self.dtype
        dims = ",".join(("<=" if dyn else "") + str(d) for d, dyn in zip(self.dims, self.dynamic or (False,) * len(self.dims), strict=True))
        return f"{self.dtype}[{dims}]"


@dataclass(frozen=True)
class Metadata:
    op_type: str = ""
    op_name: str = ""
    source_file: str = ""
    source_line: int = 0
    stack_frame_id: int = 0
    # stack_frame_id resolved through the module's StackFrames tables (newer XLA, JAX): (file,
    # line, function), innermost first. Derived data: not part of equality.
    frames: tuple[tuple[str, int, str], ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class Location:
    """Where a piece of HLO text came from (1-based line and column)."""

    path: str
    line: int
    column: int = 1

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.column}"


@dataclass
class Instruction:
    name: str  # without the leading %
    opcode: str
    shape: Shape
    operands: list[str]  # instruction names, without %
    attrs: dict[str, str] = field(default_factory=dict)  # raw text of each key=value
    parsed: dict[str, Any] = field(default_factory=dict)  # typed reading of understood keys
    metadata: Metadata = field(default_factory=Metadata)
    literal: str | None = None  # constant(...) payload, verbatim
    parameter_number: int | None = None
    tuple_index: int | None = None  # get-tuple-element index
    is_root: bool = False
    loc: Location | None = None
    # The instruction this one was made from by the normalizer (one part of a split tuple
    # all-reduce): the source map names the original, so the part reports its source.
    origin: str | None = None

    @property
    def called(self) -> list[str]:
        """Names of computations this instruction calls (to_apply, calls, body, condition, ...)."""
        out: list[str] = []
        for key in ("to_apply", "calls", "body", "condition", "true_computation", "false_computation"):
            v = self.parsed.get(key)
            if isinstance(v, str):
                out.append(v)
            elif isinstance(v, list):
                out.extend(v)
        branches = self.parsed.get("branch_computations")
        if isinstance(branches, list):
            out.extend(branches)
        return out


@dataclass
class Computation:
    name: str
    instructions: list[Instruction]  # in printed order (a topological order)
    is_entry: bool = False
    loc: Location | None = None

    def __post_init__(self) -> None:
        self._by_name = {i.name: i for i in self.instructions}

    def reindex(self) -> None:
        self._by_name = {i.name: i for i in self.instructions}

    def __getitem__(self, name: str) -> Instruction:
        return self._by_name[name]

    def get(self, name: str) -> Instruction | None:
        return self._by_name.get(name)

    @property
    def root(self) -> Instruction:
        for i in self.instructions:
            if i.is_root:
                return i
        return self.instructions[-1]

    @property
    def parameters(self) -> list[Instruction]:
        ps = [i for i in self.instructions if i.opcode == "parameter"]
        return sorted(ps, key=lambda i: i.parameter_number or 0)


@dataclass
class Module:
    name: str
    computations: dict[str, Computation]
    entry_name: str
    header: dict[str, str] = field(default_factory=dict)  # raw header attributes
    path: str = "<string>"

    @property
    def entry(self) -> Computation:
        return self.computations[self.entry_name]
