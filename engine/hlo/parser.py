"""HLO text -> IR (``engine/ir.py``).

Accepts the text XLA prints for torch-xla, JAX and Neuron: old style (``%`` names, computation
signatures, operands with shapes) and new style (bare names, ``name {`` computation headers),
scheduled modules, and the stack-frame tables newer XLA prints between header and computations.

The parser is a hand-written scanner over one string: every step is a compiled regex anchored at
the current position (``pattern.match(text, pos)``), so large modules cost a few regex calls per
instruction and no string is re-sliced per character. Bracketed values that the engine does not
interpret are skipped by a bracket-balancing scan and kept verbatim.

Comments (``/* ... */`` and ``// ...``) are blanked out before scanning (replaced by spaces, line
breaks kept), so positions and therefore line:column in errors stay those of the original text.
"""

from __future__ import annotations

import bisect
import codecs
import dataclasses
import os
import re
from collections.abc import Callable
from itertools import product
from typing import Any, NoReturn

from ..errors import HloParseError, InputError
from ..gcpause import gc_paused
from ..ir import ELEMENT_TYPES, Computation, Instruction, Location, Metadata, Module, Shape
from .literals import LiteralError, read_scalar, scalar_text
from .meshgroups import MeshGroupError, mesh_groups

__all__ = ["literal_is_elided", "parse_hlo", "parse_hlo_file"]


def literal_is_elided(literal: str | None) -> bool:
    """True for a constant whose elements the printer left out. XLA's text printer (and so
    torch-xla's ``_get_xla_tensors_hlo`` and JAX's ``as_text``) writes a literal of more than
    10 elements as ``{...}`` unless told to print large constants; no literal with values
    contains ``...``. Such a constant is an unknown value: the analysis relates it to nothing,
    not even to another elided literal of the same shape (analysis/graph.py)."""
    return literal is not None and "..." in literal

# --- lexical pieces -------------------------------------------------------------------------

# A string is kept together with comments in one alternation so that "/*" inside a string is
# never taken for a comment. The lone "/\*" catches a comment that is never closed.
_COMMENT_OR_STRING = re.compile(r'"[^"\\]*+(?:\\.[^"\\]*+)*+"|/\*.*?\*/|//[^\n]*|/\*', re.S)
_STRING_1L = re.compile(r'"[^"\\\n]*+(?:\\.[^"\\\n]*+)*+"')
_STRING_ML = re.compile(r'"[^"\\]*+(?:\\.[^"\\]*+)*+"', re.S)
_WS = re.compile(r"\s*")
_SPACES = re.compile(r"[ \t\r\f\v]*")
_NAME = re.compile(r"%?([A-Za-z0-9_][A-Za-z0-9_.\-]*)")
_MODULE_NAME = re.compile(r"[^\s,{}()]+")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_OPCODE = re.compile(r"[A-Za-z][A-Za-z0-9_.\-]*")
_ATTR_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_TYPE_BRACKET = re.compile(r"([A-Za-z][A-Za-z0-9]*)\[")
# The common case (an array shape with an optional simple layout) in one match, so it can be
# looked up in a cache instead of being parsed again for every instruction.
_SIMPLE_SHAPE = re.compile(r"[a-z][a-z0-9]*\[[0-9,<=?]*\](?:\{[^{}\n]*\})?")
_INT = re.compile(r"-?\d+")
_INT_FULL = re.compile(r"-?\d+\Z")
_FLAT_CHUNK = re.compile(r'[^\s,{}\[\]()"]+')
_NESTED_1L = re.compile(r'[^{}\[\]()"\n]+')
_NESTED_ML = re.compile(r'[^{}\[\]()"]+')
_CLOSER = {"{": "}", "[": "]", "(": ")"}

# Fast paths for the common shapes of text; whenever one does not match, the general scanner
# takes over from the same position (so they change speed, never the accepted language).
# Possessive quantifiers keep a failed match linear (no backtracking into nested repeats).
_STR = r'"[^"\\\n]*+(?:\\.[^"\\\n]*+)*+"'
_FAST_ATTR = re.compile(
    r"[ \t]*,[ \t]*([A-Za-z_][A-Za-z0-9_.\-]*)=("
    r'(?:[^\s,{}\[\]()"]++|' + _STR + r'|\{(?:[^{}\[\]()"\n]++|' + _STR + r'|\{[^{}\[\]()"\n]*+\})*+\})*+'
    r")"
)
_LINE_END = re.compile(r"[ \t\r\f\v]*(?:\n|\Z)")
_CONTINUATION = re.compile(r"\s*,")  # a line break before ',' continues the attribute list
_FAST_HEAD = re.compile(r"(ROOT[ \t]+)?%?([A-Za-z0-9_][A-Za-z0-9_.\-]*)[ \t]*=[ \t]*")
_FAST_OPCODE = re.compile(r"[ \t]*([A-Za-z][A-Za-z0-9_.\-]*)\(")
_FAST_OPERAND = re.compile(
    r"[ \t]*(?:[a-z][a-z0-9]*\[[0-9,<=?]*\](?:\{[^{}\n]*\})?[ \t]+)?"  # optional operand shape
    r"(%?)([A-Za-z0-9_][A-Za-z0-9_.\-]*)[ \t]*([,)])"
)

# Tables newer XLA prints between the module header and the first computation (source locations
# that metadata's stack_frame_id points into).
_SECTIONS = frozenset({"FileNames", "FunctionNames", "FileLocations", "StackFrames"})


class _ScanError(Exception):
    """A problem at ``offset`` inside some string; the caller turns it into an HloParseError."""

    def __init__(self, offset: int, message: str) -> None:
        super().__init__(message)
        self.offset = offset
        self.message = message


def _string_end(s: str, pos: int, multiline: bool) -> int:
    m = (_STRING_ML if multiline else _STRING_1L).match(s, pos)
    if m is None:
        raise _ScanError(pos, "unterminated string: expected '\"'")
    return m.end()


def _balanced_end(s: str, pos: int, multiline: bool = False) -> int:
    """Index just past the bracket that closes the one at ``s[pos]``; strings are skipped whole.

    Single-line by default: XLA prints every instruction on one line, so a value still open at
    the end of its line is reported there instead of swallowing the following instructions.
    """
    chunk = _NESTED_ML if multiline else _NESTED_1L
    n = len(s)
    openers = [pos]
    pos += 1
    while openers:
        m = chunk.match(s, pos)
        if m is not None:
            pos = m.end()
        if pos >= n or s[pos] == "\n":
            o = openers[-1]
            where = "end of input" if pos >= n else "end of line"
            raise _ScanError(pos, f"expected '{_CLOSER[s[o]]}' to close '{s[o]}' before {where}")
        c = s[pos]
        if c == '"':
            pos = _string_end(s, pos, multiline)
        elif c in _CLOSER:
            openers.append(pos)
            pos += 1
        else:
            want = _CLOSER[s[openers[-1]]]
            if c != want:
                raise _ScanError(pos, f"expected '{want}' but found '{c}'")
            openers.pop()
            pos += 1
    return pos


def _value_end(s: str, pos: int) -> int:
    """End of an attribute value: a run of non-blank text in which brackets and strings nest."""
    n = len(s)
    start = pos
    while pos < n:
        m = _FLAT_CHUNK.match(s, pos)
        if m is not None:
            pos = m.end()
            if pos >= n:
                break
        c = s[pos]
        if c in _CLOSER:
            pos = _balanced_end(s, pos)
        elif c == '"':
            pos = _string_end(s, pos, False)
        else:
            break
    if s.startswith("mesh[", start):
        # A mesh replica-group list: ``mesh[..], device_ids=(..) {..}`` (see hlo.meshgroups).
        if s.startswith(", device_ids=(", pos):
            pos = _balanced_end(s, pos + len(", device_ids="))
        if s.startswith(" {", pos):
            pos = _balanced_end(s, pos + 1)
    return pos


_SIMPLE_ESCAPES = {
    "n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v",
    "\\": "\\", '"': '"', "'": "'", "?": "?",
}  # fmt: skip
_ESCAPE = re.compile(r"\\(?:([0-7]{1,3})|x([0-9A-Fa-f]{1,2})|(.))", re.S)


# Escapes that codecs.escape_decode reads exactly as absl::CUnescape does; anything else takes
# the slow path (escape_decode would keep or reject it differently).
_UNUSUAL_ESCAPE = re.compile(r"\\(?:[^0-7xntrabfv\"'\\]|x(?![0-9A-Fa-f]{2}))")


def _unescape(body: str) -> str:
    """Undo XLA's C-style escaping (absl::CEscape): octal/hex escapes are bytes of UTF-8 text.
    A lone surrogate (text read with surrogate escapes, or fuzzed) is kept as its bytes and
    decoded as U+FFFD, like any other invalid UTF-8: never an encoding crash."""
    if "\\" not in body:
        return body
    if _UNUSUAL_ESCAPE.search(body) is None:
        return codecs.escape_decode(body.encode("utf-8", "surrogatepass"))[0].decode("utf-8", errors="replace")
    out = bytearray()
    last = 0
    for m in _ESCAPE.finditer(body):
        out += body[last : m.start()].encode("utf-8", "surrogatepass")
        octal, hexa, char = m.groups()
        if octal is not None:
            out.append(int(octal, 8) & 0xFF)
        elif hexa is not None:
            out.append(int(hexa, 16))
        else:
            out += _SIMPLE_ESCAPES.get(char, char).encode("utf-8", "surrogatepass")
        last = m.end()
    out += body[last:].encode("utf-8", "surrogatepass")
    return out.decode("utf-8", errors="replace")


def _unquote(raw: str) -> str:
    if len(raw) >= 2 and raw[0] == '"' and raw[-1] == '"':
        return _unescape(raw[1:-1])
    return raw


# --- typed readers for attribute values ----------------------------------------------------
# Each takes the raw value text and returns the typed reading, raising _ScanError (offset into
# the raw text) when the value does not have the form the key requires.

_INT_LIST_FULL = re.compile(r"\{\s*(?:-?\d+\s*(?:,\s*-?\d+\s*)*)?\}\Z")
_SLICE_DIM = re.compile(r"\[\s*(-?\d+)\s*:\s*(-?\d+)\s*(?::\s*(-?\d+)\s*)?\]")
_SLICE_FULL = re.compile(r"\{\s*(?:\[[^\[\]]*\]\s*(?:,\s*\[[^\[\]]*\]\s*)*)?\}\Z")
_PAD_DIM = re.compile(r"(-?\d+)_(-?\d+)(?:_(-?\d+))?\Z")
_INTS = r"\s*(?:-?\d+\s*(?:,\s*-?\d+\s*)*)?"
_GROUPS_FULL = re.compile(r"\{\s*(?:\{" + _INTS + r"\}\s*(?:,\s*\{" + _INTS + r"\}\s*)*)?\}\Z")
_GROUP = re.compile(r"\{([^{}]*)\}")
_INT_CSV = re.compile(r"\s*(?:-?\d+\s*(?:,\s*-?\d+\s*)*)?\Z")
_IOTA_GROUPS = re.compile(r"\[([^\[\]]*)\]<=\[([^\[\]]*)\](?:T\(([^()]*)\))?\Z")
_COMP_REF = re.compile(r"%?([A-Za-z0-9_][A-Za-z0-9_.\-]*)\Z")


def _csv_ints(text: str, offset: int = 0) -> list[int]:
    if not _INT_CSV.match(text):
        raise _ScanError(offset, f"expected a comma-separated list of integers, got '{text}'")
    return [int(x) for x in _INT.findall(text)]


def _read_int(raw: str) -> int:
    if not _INT_FULL.match(raw):
        raise _ScanError(0, f"expected an integer, got '{raw}'")
    return int(raw)


def _read_bool(raw: str) -> bool:
    if raw == "true":
        return True
    if raw == "false":
        return False
    raise _ScanError(0, f"expected true or false, got '{raw}'")


def _read_int_list(raw: str) -> list[int]:
    if not _INT_LIST_FULL.match(raw):
        raise _ScanError(0, f"expected a list of integers like {{0,1}}, got '{raw}'")
    inner = raw[1:-1]
    return [int(x) for x in inner.split(",")] if inner.strip() else []


def _read_str(raw: str) -> str:
    if not raw:
        raise _ScanError(0, "expected a value")
    return _unquote(raw)


def _read_raw(raw: str) -> str:
    return raw


def _read_slice(raw: str) -> list[tuple[int, int, int]]:
    if not _SLICE_FULL.match(raw):
        raise _ScanError(0, f"expected a slice like {{[0:8:1], [2:4]}}, got '{raw}'")
    out: list[tuple[int, int, int]] = []
    for m in re.finditer(r"\[[^\[\]]*\]", raw):
        d = _SLICE_DIM.fullmatch(m.group(0))
        if d is None:
            raise _ScanError(m.start(), f"expected [start:limit] or [start:limit:stride], got '{m.group(0)}'")
        out.append((int(d.group(1)), int(d.group(2)), int(d.group(3)) if d.group(3) else 1))
    return out


def _read_padding(raw: str) -> list[tuple[int, int, int]]:
    if not raw:
        return []  # a rank-0 pad prints an empty padding
    out: list[tuple[int, int, int]] = []
    offset = 0
    for part in raw.split("x"):
        m = _PAD_DIM.match(part)
        if m is None:
            raise _ScanError(offset, f"expected padding like 0_0x1_2_0 (low_high[_interior]), got '{part}'")
        out.append((int(m.group(1)), int(m.group(2)), int(m.group(3)) if m.group(3) else 0))
        offset += len(part) + 1
    return out


MAX_IOTA_DEVICES = 1 << 16  # 65,536 devices: far past any real mesh (and expanded in milliseconds)
MAX_TUPLE_DEPTH = 64


def _iota_groups(group_dims: list[int], reshape: list[int], perm: list[int] | None) -> list[list[int]]:
    """Expand XLA's iota replica-group list ``[G,S]<=[reshape]T(perm)`` to explicit groups.

    The device list is iota(prod(reshape)), viewed with the ``reshape`` dims, transposed by
    ``perm``, flattened, and cut into G groups of S devices.
    """
    total = 1
    for d in reshape:
        total *= d
    if len(group_dims) != 2:
        raise _ScanError(0, f"expected two group dimensions [groups,size], got {group_dims}")
    if group_dims[0] * group_dims[1] != total:
        raise _ScanError(0, f"group dimensions {group_dims} do not cover the {total} devices of {reshape}")
    if total > MAX_IOTA_DEVICES:
        raise _ScanError(0, f"an iota replica-group list over {total} devices is beyond the {MAX_IOTA_DEVICES} this tool expands")
    if perm is None:
        flat = list(range(total))
    else:
        if sorted(perm) != list(range(len(reshape))):
            raise _ScanError(0, f"T{tuple(perm)} is not a permutation of the {len(reshape)} reshape dimensions")
        strides = [1] * len(reshape)
        for i in range(len(reshape) - 2, -1, -1):
            strides[i] = strides[i + 1] * reshape[i + 1]
        tdims = [reshape[p] for p in perm]
        tstrides = [strides[p] for p in perm]
        flat = [
            sum(i * st for i, st in zip(idx, tstrides, strict=True))
            for idx in product(*(range(d) for d in tdims))
        ]
    size = group_dims[1]
    return [flat[g * size : (g + 1) * size] for g in range(group_dims[0])]


def _read_replica_groups(raw: str) -> list[list[int]]:
    if raw.startswith("mesh["):
        try:
            return mesh_groups(raw)
        except MeshGroupError as e:
            raise _ScanError(0, str(e)) from None
    if raw.startswith("["):
        m = _IOTA_GROUPS.match(raw)
        if m is None:
            raise _ScanError(0, f"expected iota replica groups like [2,2]<=[4] or [2,2]<=[2,2]T(1,0), got '{raw}'")
        perm = _csv_ints(m.group(3)) if m.group(3) is not None else None
        return _iota_groups(_csv_ints(m.group(1)), _csv_ints(m.group(2)), perm)
    if not _GROUPS_FULL.match(raw):
        raise _ScanError(0, f"expected replica groups like {{{{0,1}},{{2,3}}}}, got '{raw}'")
    return [[int(x) for x in g.split(",")] if g.strip() else [] for g in _GROUP.findall(raw, 1)]


def _read_pairs(raw: str) -> list[tuple[int, int]]:
    if not _GROUPS_FULL.match(raw):
        raise _ScanError(0, f"expected source-target pairs like {{{{0,1}},{{1,2}}}}, got '{raw}'")
    out: list[tuple[int, int]] = []
    for g in _GROUP.finditer(raw, 1):
        pair = _csv_ints(g.group(1), g.start())
        if len(pair) != 2:
            raise _ScanError(g.start(), f"expected a {{source,target}} pair, got '{g.group(0)}'")
        out.append((pair[0], pair[1]))
    return out


def _read_comp_ref(raw: str) -> str:
    m = _COMP_REF.match(raw)
    if m is None:
        raise _ScanError(0, f"expected a computation name, got '{raw}'")
    return m.group(1)


def _read_comp_refs(raw: str) -> list[str]:
    if not (raw.startswith("{") and raw.endswith("}")):
        raise _ScanError(0, f"expected a list of computations like {{%a, %b}}, got '{raw}'")
    inner = raw[1:-1].strip()
    return [_read_comp_ref(part.strip()) for part in inner.split(",")] if inner else []


def _read_calls(raw: str) -> str | list[str]:
    return _read_comp_refs(raw) if raw.startswith("{") else _read_comp_ref(raw)


def _read_window(raw: str) -> dict[str, str]:
    if not (raw.startswith("{") and raw.endswith("}")):
        raise _ScanError(0, f"expected a window like {{size=3x3 stride=2x2}}, got '{raw}'")
    out: dict[str, str] = {}
    for m in re.finditer(r"\S+", raw[1:-1]):
        key, eq, value = m.group(0).partition("=")
        if not eq or not key:
            raise _ScanError(m.start() + 1, f"expected key=value in window, got '{m.group(0)}'")
        out[key] = value
    return out


_METADATA_INTS = ("source_line", "stack_frame_id")
_METADATA_STRS = ("op_type", "op_name", "source_file")


# One field: key, then a string, a bracketed group without nested braces, or a bare token.
_METADATA_FIELD = r'([A-Za-z_][A-Za-z0-9_.\-]*)=("[^"\\\n]*+(?:\\.[^"\\\n]*+)*+"|\{[^{}\n]*\}|[^\s{}"]*)'
_METADATA_ITEM = re.compile(r"\s*" + _METADATA_FIELD)
_METADATA_FULL = re.compile(r"\{(?:\s*" + _METADATA_FIELD + r")*+\s*\}\Z")


def _read_metadata(raw: str) -> Metadata:
    # Well-formed metadata (nearly all of it) is split by one findall; anything else takes the
    # field-by-field loop, which finds the offending offset.
    if _METADATA_FULL.match(raw):
        fields: dict[str, Any] = {}
        for key, value in _METADATA_ITEM.findall(raw, 1, len(raw) - 1):
            if key in _METADATA_STRS:
                fields[key] = _unquote(value)
            elif key in _METADATA_INTS:
                if not _INT_FULL.match(value):
                    return _read_metadata_slowly(raw)
                fields[key] = int(value)
        return Metadata(**fields)
    return _read_metadata_slowly(raw)


_TABLE_ENTRY = re.compile(r"(\d+)\s+(.*)")
_TABLE_FIELD = re.compile(r"([A-Za-z_]+)=(-?\d+)")


def _table(raw: str) -> dict[int, str]:
    """A stack-frame table as the parser kept it (``<id> <value>`` lines): id -> value text."""
    out: dict[int, str] = {}
    for line in raw.splitlines():
        m = _TABLE_ENTRY.match(line.strip())
        if m:
            out[int(m.group(1))] = m.group(2).strip()
    return out


def _fields(value: str) -> dict[str, int]:
    return {k: int(v) for k, v in _TABLE_FIELD.findall(value)}


def _resolve_stack_frames(header: dict[str, str], computations: dict[str, Computation]) -> None:
    """Give each instruction's metadata the Python stack its ``stack_frame_id`` names, read from
    the tables XLA prints after the module header (FileNames, FunctionNames, FileLocations,
    StackFrames; ids 1-based). The printed ``parent_frame_id`` is the parent's id plus one (0 and
    1 both mean "outermost"): in a JAX dump of f -> middle -> inner, inner's frame 4 prints
    parent 4 for middle's frame 3. A dump that prints a parent 0 and never a frame's own id is
    read as plain ids. Ids that resolve to nothing are skipped (the source then says why)."""
    if "StackFrames" not in header:
        return
    files = {k: _unquote(v) for k, v in _table(header.get("FileNames", "")).items()}
    functions = {k: _unquote(v) for k, v in _table(header.get("FunctionNames", "")).items()}
    locations = {k: _fields(v) for k, v in _table(header.get("FileLocations", "")).items()}
    frames = {k: _fields(v) for k, v in _table(header["StackFrames"]).items()}
    parents = {k: f.get("parent_frame_id", 0) for k, f in frames.items()}
    shifted = any(p == k for k, p in parents.items()) or (bool(parents) and min(parents.values()) >= 1)
    chains: dict[int, tuple[tuple[str, int, str], ...]] = {}

    def chain(frame_id: int) -> tuple[tuple[str, int, str], ...]:
        if frame_id not in chains:
            out: list[tuple[str, int, str]] = []
            seen: set[int] = set()
            at = frame_id
            while at in frames and at not in seen:
                seen.add(at)
                loc = locations.get(frames[at].get("file_location_id", 0))
                if loc is None or loc.get("file_name_id", 0) not in files:
                    break
                out.append((files[loc["file_name_id"]], loc.get("line", 0), functions.get(loc.get("function_name_id", 0), "")))
                parent = parents[at]
                at = parent - 1 if shifted else parent
            chains[frame_id] = tuple(out)
        return chains[frame_id]

    resolved: dict[Metadata, Metadata] = {}
    for comp in computations.values():
        for ins in comp.instructions:
            md = ins.metadata
            if not md.stack_frame_id:
                continue
            if md not in resolved:
                # Metadata compares without frames: key on every field that decides the chain.
                resolved[md] = dataclasses.replace(md, frames=chain(md.stack_frame_id))
            ins.metadata = resolved[md]


def _read_metadata_slowly(raw: str) -> Metadata:
    if not (raw.startswith("{") and raw.endswith("}")):
        raise _ScanError(0, f"expected metadata in braces, got '{raw}'")
    fields: dict[str, Any] = {}
    pos = 1
    end = len(raw) - 1
    while True:
        m = _METADATA_ITEM.match(raw, pos, end)
        if m is None:
            rest = raw[pos:end]
            if rest.strip():
                raise _ScanError(pos + len(rest) - len(rest.lstrip()), "expected key=value in metadata")
            return Metadata(**fields)
        key, value = m.groups()
        if key in _METADATA_STRS:
            fields[key] = _unquote(value)
        elif key in _METADATA_INTS:
            if not _INT_FULL.match(value):
                raise _ScanError(m.start(2), f"expected an integer for metadata {key}, got '{value}'")
            fields[key] = int(value)
        pos = m.end()


_READERS: dict[str, Callable[[str], Any]] = {
    "dimensions": _read_int_list,
    "slice": _read_slice,
    "padding": _read_padding,
    "lhs_batch_dims": _read_int_list,
    "rhs_batch_dims": _read_int_list,
    "lhs_contracting_dims": _read_int_list,
    "rhs_contracting_dims": _read_int_list,
    "replica_groups": _read_replica_groups,
    "source_target_pairs": _read_pairs,
    "channel_id": _read_int,
    "use_global_device_ids": _read_bool,
    "to_apply": _read_comp_ref,
    "calls": _read_calls,
    "body": _read_comp_ref,
    "condition": _read_comp_ref,
    "true_computation": _read_comp_ref,
    "false_computation": _read_comp_ref,
    "branch_computations": _read_comp_refs,
    "custom_call_target": _read_str,
    "backend_config": _read_raw,
    "direction": _read_str,
    "type": _read_str,
    "iota_dimension": _read_int,
    "index_vector_dim": _read_int,
    "offset_dims": _read_int_list,
    "collapsed_slice_dims": _read_int_list,
    "start_index_map": _read_int_list,
    "operand_batching_dims": _read_int_list,
    "start_indices_batching_dims": _read_int_list,
    "slice_sizes": _read_int_list,
    "indices_are_sorted": _read_bool,
    "update_window_dims": _read_int_list,
    "inserted_window_dims": _read_int_list,
    "scatter_dims_to_operand_dims": _read_int_list,
    "input_batching_dims": _read_int_list,
    "scatter_indices_batching_dims": _read_int_list,
    "dynamic_slice_sizes": _read_int_list,
    "window": _read_window,
    "sharding": _read_raw,
    "frontend_attributes": _read_raw,
    "exponent_bits": _read_int,
    "mantissa_bits": _read_int,
    "distribution": _read_raw,
    "fft_type": _read_raw,
    "fft_length": _read_raw,
    "is_stable": _read_bool,
    "largest": _read_bool,
    "k": _read_int,
    "precision_config": _read_raw,
    "operand_precision": _read_raw,
    "algorithm": _read_raw,
    "constrain_layout": _read_bool,
    "split_dimension": _read_int,
    "custom_call_has_side_effect": _read_bool,
    "api_version": _read_raw,
    "output_to_operand_aliasing": _read_raw,
    "schedule": _read_raw,
    "metadata": _read_metadata,
}

# Attributes naming other computations; each must name a computation of the module.
_CALL_KEYS = frozenset(
    {"to_apply", "calls", "body", "condition", "true_computation", "false_computation", "branch_computations"}
)


def _strip_comments(text: str) -> tuple[str, list[tuple[int, int]]]:
    """Blank out comments (same length, line breaks kept); return the text and comment spans."""
    if "/*" not in text and "//" not in text:
        return text, []
    spans: list[tuple[int, int]] = []

    def blank(m: re.Match[str]) -> str:
        t = m.group(0)
        if t[0] == '"':
            return t
        if t == "/*" and not text.startswith("*/", m.end()):
            raise _ScanError(m.start(), "unterminated comment: expected '*/'")
        spans.append((m.start(), m.end()))
        return re.sub(r"[^\n]", " ", t)

    return _COMMENT_OR_STRING.sub(blank, text), spans


def _drop_comments(text: str) -> str:
    return _COMMENT_OR_STRING.sub(lambda m: m.group(0) if m.group(0)[0] == '"' else "", text)


class _Parser:
    def __init__(self, text: str, path: str) -> None:
        self.path = path
        self.src = text
        self.line_starts = [0] + [m.end() for m in re.finditer("\n", text)]
        try:
            self.s, self.comments = _strip_comments(text)
        except _ScanError as e:
            self.fail(e.offset, e.message)
        if self.s.startswith("\ufeff"):  # a byte-order mark; blanked so positions stay put
            self.s = " " + self.s[1:]
        self.comment_starts = [a for a, _ in self.comments]
        self.n = len(self.s)
        self.pos = 0
        self.shape_cache: dict[str, Shape] = {}
        self.metadata_cache: dict[str, Metadata] = {}
        # (computation, value position, key, callee name(s), raw value) for every call, checked once
        # all computations are known (a module may print a callee after its caller).
        self.calls: list[tuple[str, int, str, str | list[str], str]] = []

    # -- positions and errors --

    def line_col(self, pos: int) -> tuple[int, int]:
        line = bisect.bisect_right(self.line_starts, pos)
        return line, pos - self.line_starts[line - 1] + 1

    def loc(self, pos: int) -> Location:
        line, col = self.line_col(pos)
        return Location(self.path, line, col)

    def fail(self, pos: int, message: str) -> NoReturn:
        pos = min(max(pos, 0), len(self.src))
        line, col = self.line_col(pos)
        start = self.line_starts[line - 1]
        end = self.src.find("\n", start)
        line_text = self.src[start : end if end >= 0 else len(self.src)]
        raise HloParseError(self.path, line, col, message, line_text)

    def raw(self, start: int, end: int) -> str:
        """Text of ``[start, end)`` as written, minus any comment inside it."""
        if self.comments:
            i = bisect.bisect_left(self.comment_starts, start)
            if i < len(self.comment_starts) and self.comment_starts[i] < end:
                return _drop_comments(self.src[start:end]).strip()
        return self.s[start:end]

    # -- small scanning steps --

    def ws(self) -> None:
        self.pos = _WS.match(self.s, self.pos).end()

    def peek(self) -> str:
        return self.s[self.pos] if self.pos < self.n else ""

    def expect(self, char: str, message: str) -> None:
        self.ws()
        if self.peek() != char:
            self.fail(self.pos, message)
        self.pos += 1

    def keyword(self, word: str) -> bool:
        """Consume ``word`` if it stands at the current position as a whole word."""
        s = self.s
        end = self.pos + len(word)
        if s.startswith(word, self.pos) and end < self.n and s[end].isspace():
            self.pos = end
            return True
        return False

    def name(self, what: str) -> tuple[str, int]:
        m = _NAME.match(self.s, self.pos)
        if m is None:
            self.fail(self.pos, f"expected {what}")
        self.pos = m.end()
        return m.group(1), m.start()

    def balanced(self, pos: int, multiline: bool = False) -> int:
        try:
            return _balanced_end(self.s, pos, multiline)
        except _ScanError as e:
            self.fail(e.offset, e.message)

    def value(self) -> tuple[str, int]:
        start = self.pos
        try:
            end = _value_end(self.s, start)
        except _ScanError as e:
            self.fail(e.offset, e.message)
        self.pos = end
        return self.raw(start, end), start

    def attributes(self, what: str, name: str = "") -> list[tuple[str, str, int]]:
        """``, key=value`` pairs up to the end of the line (a line break before a ',' continues).

        Returns (key, raw value, value position) in printed order. ``what`` and ``name`` only
        go into error messages (joined there, so the common path formats nothing).
        """
        s = self.s
        n = self.n
        fast_attr = _FAST_ATTR.match
        out: list[tuple[str, str, int]] = []
        while True:
            pos = self.pos
            while (fast := fast_attr(s, pos)) is not None:
                vstart, vend = fast.span(2)
                if vend < n and s[vend] in '{[("':
                    # Deeper nesting than the fast pattern covers: scan the value properly.
                    self.pos = vstart
                    raw, _ = self.value()
                    pos = self.pos
                else:
                    raw = self.raw(vstart, vend) if self.comments else s[vstart:vend]
                    pos = vend
                out.append((fast.group(1), raw, vstart))
            self.pos = pos
            end = _LINE_END.match(s, pos)
            if end is not None and _CONTINUATION.match(s, end.end()) is None:
                self.pos = end.end() - 1 if end.group(0).endswith("\n") else end.end()
                return out
            p = _SPACES.match(s, pos).end()
            c = s[p] if p < n else ""
            if c == "\n":
                q = _WS.match(s, p).end()
                if q < n and s[q] == ",":
                    p, c = q, ","
            if c != ",":
                if c not in ("", "\n"):
                    self.fail(p, f"expected ',' or end of line after {what}{name}")
                self.pos = p
                return out
            self.pos = p + 1
            self.ws()
            km = _ATTR_KEY.match(s, self.pos)
            if km is None:
                self.fail(self.pos, f"expected attribute name after ',' in {what}{name}")
            key = km.group(0)
            self.pos = km.end()
            if self.peek() != "=":
                self.fail(self.pos, f"expected '=' after attribute name '{key}'")
            self.pos += 1
            raw, vpos = self.value()
            out.append((key, raw, vpos))

    # -- grammar --

    def shape(self) -> Shape:
        s = self.s
        pos = self.pos
        m = _SIMPLE_SHAPE.match(s, pos)
        if m is not None:
            text = m.group(0)
            cached = self.shape_cache.get(text)
            if cached is not None:
                self.pos = m.end()
                return cached
            shape = self._array_shape()
            self.shape_cache[text] = shape
            return shape
        if pos < self.n and s[pos] == "(":
            self.tuple_depth = getattr(self, "tuple_depth", 0) + 1
            if self.tuple_depth > MAX_TUPLE_DEPTH:
                self.fail(pos, f"tuple shapes nested deeper than {MAX_TUPLE_DEPTH} levels")
            try:
                return self._tuple_shape()
            finally:
                self.tuple_depth -= 1
        return self._array_shape()

    def _tuple_shape(self) -> Shape:
        self.pos += 1
        self.ws()
        items: list[Shape] = []
        if self.peek() == ")":
            self.pos += 1
            return Shape("tuple")
        while True:
            items.append(self.shape())
            self.ws()
            c = self.peek()
            self.pos += 1
            if c == ")":
                return Shape("tuple", tuple_shapes=tuple(items))
            if c != ",":
                self.fail(self.pos - 1, "expected ',' or ')' in tuple shape")
            self.ws()

    def _array_shape(self) -> Shape:
        s = self.s
        pos = self.pos
        m = _TYPE_BRACKET.match(s, pos)
        if m is None:
            w = _WORD.match(s, pos)
            if w is not None and w.group(0) in ("token", "opaque"):
                self.pos = w.end()
                return Shape(w.group(0))
            found = f", found '{w.group(0)}'" if w is not None else ""
            self.fail(pos, f"expected a shape like f32[2,3]{found}")
        etype = m.group(1)
        if etype not in ELEMENT_TYPES:
            self.fail(pos, f"unknown element type '{etype}'")
        close = s.find("]", m.end())
        nl = s.find("\n", m.end())
        if close < 0 or (0 <= nl < close):
            self.fail(m.end() - 1, "expected ']' to close the dimensions of the shape")
        dims: list[int] = []
        dynamic: list[bool] = []
        text = s[m.end() : close]
        if text.strip():
            offset = m.end()
            for part in text.split(","):
                d = part.strip()
                dyn = False
                if d.startswith("<="):
                    dyn, d = True, d[2:].strip()
                if d == "?":  # unbounded dynamic dimension
                    dims.append(-1)
                    dynamic.append(True)
                elif d.isascii() and d.isdigit():
                    dims.append(int(d))
                    dynamic.append(dyn)
                else:
                    at = offset + len(part) - len(part.lstrip())
                    self.fail(at, f"invalid dimension '{part.strip()}' in shape")
                offset += len(part) + 1
        self.pos = close + 1
        layout = None
        if self.pos < self.n and s[self.pos] == "{":
            end = self.balanced(self.pos)
            layout = self.raw(self.pos + 1, end - 1)
            self.pos = end
        return Shape(etype, tuple(dims), layout, (), tuple(dynamic) if any(dynamic) else ())

    def instruction(self, comp: str, defined: dict[str, Instruction]) -> Instruction:
        s = self.s
        start = self.pos
        head = _FAST_HEAD.match(s, start)
        if head is not None:
            is_root = head.group(1) is not None
            name = head.group(2)
            self.pos = head.end()
        else:
            is_root = self.keyword("ROOT")
            if is_root:
                self.ws()
            name, _ = self.name("instruction name (or '}' to end the computation)")
            self.ws()
            if self.peek() != "=":
                # A computation header here means the previous computation was never closed.
                hint = " (is a '}' missing before this line?)" if name == "ENTRY" or self.peek() in ("{", "(") else ""
                self.fail(self.pos, f"expected '=' after instruction name %{name}{hint}")
            self.pos += 1
            self.ws()
        shape = self.shape()
        om = _FAST_OPCODE.match(s, self.pos)
        if om is not None:
            opcode = om.group(1)
            self.pos = om.end() - 1
        else:
            self.ws()
            om = _OPCODE.match(s, self.pos)
            if om is None:
                self.fail(self.pos, f"expected opcode after the shape of %{name}")
            opcode = om.group(0)
            self.pos = om.end()
            self.ws()
            if self.peek() != "(":
                self.fail(self.pos, f"expected '(' after opcode '{opcode}'")
        operands: list[str] = []
        literal: str | None = None
        parameter_number: int | None = None
        if opcode == "constant":
            # Literals are kept verbatim; old XLA may spread a large one over several lines.
            end = self.balanced(self.pos, multiline=True)
            literal = self.raw(self.pos + 1, end - 1).strip()
            if not shape.dims and not shape.is_tuple:
                self._check_scalar_literal(shape.dtype, literal, self.pos + 1, name)
            self.pos = end
        elif opcode == "parameter":
            self.pos += 1
            self.ws()
            im = _INT.match(s, self.pos)
            if im is None or im.group(0).startswith("-"):
                self.fail(self.pos, "expected parameter number")
            parameter_number = int(im.group(0))
            self.pos = im.end()
            self.expect(")", "expected ')' after parameter number")
        else:
            self.pos += 1
            closed = False
            while True:  # one operand per match while the operands are plainly printed
                fo = _FAST_OPERAND.match(s, self.pos)
                if fo is None:
                    break
                op = fo.group(2)
                if op not in defined:
                    self.fail(fo.start(1), f"operand %{op} is not defined in computation %{comp}")
                operands.append(op)
                self.pos = fo.end()
                if fo.group(3) == ")":
                    closed = True
                    break
            if not closed:
                self.ws()
            if not closed and not operands and self.peek() == ")":
                self.pos += 1
            elif not closed:
                while True:
                    c = self.peek()
                    if c == "(" or _TYPE_BRACKET.match(s, self.pos):
                        self.shape()  # newer XLA prints each operand's shape before its name
                        self.ws()
                    if self.peek() == ")":
                        self.fail(self.pos, "expected operand name")
                    op, op_pos = self.name("operand name")
                    if op not in defined:
                        if re.match(r"[ \t]*=", s[self.pos : self.pos + 64]):
                            # `name=` is an attribute: the operand list was never closed
                            self.fail(op_pos, f"expected ')' closing the operands of %{name} before attribute '{op}'")
                        self.fail(op_pos, f"operand %{op} is not defined in computation %{comp}")
                    operands.append(op)
                    self.ws()
                    c = self.peek()
                    self.pos += 1
                    if c == ")":
                        break
                    if c != ",":
                        self.fail(self.pos - 1, "expected ')' after operand list")
                    self.ws()
        attrs: dict[str, str] = {}
        parsed: dict[str, Any] = {}
        metadata = Metadata()
        tuple_index: int | None = None
        for key, raw, vpos in self.attributes("instruction %", name):
            if key in attrs:
                self.fail(vpos - len(key) - 1, f"duplicate attribute '{key}' in instruction %{name}")
            attrs[key] = raw
            if key == "metadata":
                # Frozen, and often repeated verbatim (torch-xla), so one reading is shared.
                cached = self.metadata_cache.get(raw)
                if cached is None:
                    try:
                        cached = _read_metadata(raw)
                    except _ScanError as e:
                        self.fail(vpos + e.offset, f"invalid metadata: {e.message}")
                    self.metadata_cache[raw] = cached
                parsed[key] = metadata = cached
                continue
            reader = _READERS.get(key)
            if reader is not None:
                try:
                    value = reader(raw)
                except _ScanError as e:
                    self.fail(vpos + e.offset, f"invalid {key}: {e.message}")
                parsed[key] = value
                if key in _CALL_KEYS:
                    self.calls.append((comp, vpos, key, value, raw))
            elif key == "index" and opcode == "get-tuple-element":
                try:
                    tuple_index = _read_int(raw)
                except _ScanError as e:
                    self.fail(vpos, f"invalid index: {e.message}")
        if opcode == "get-tuple-element" and tuple_index is None:
            self.fail(start, f"get-tuple-element %{name} needs an index=N attribute")
        line = bisect.bisect_right(self.line_starts, start)
        return Instruction(
            name=name,
            opcode=opcode,
            shape=shape,
            operands=operands,
            attrs=attrs,
            parsed=parsed,
            metadata=metadata,
            literal=literal,
            parameter_number=parameter_number,
            tuple_index=tuple_index,
            is_root=is_root,
            loc=Location(self.path, line, start - self.line_starts[line - 1] + 1),
        )

    def _check_scalar_literal(self, dtype: str, literal: str, pos: int, name: str) -> None:
        """A scalar constant must be a value of its type (XLA's parser refuses the rest): an
        integer in the type's range, a float, true/false. Read exactly by hlo.literals."""
        text = scalar_text(literal)
        if text is None or "..." in text:
            return  # elided literals are the elision pass's business
        try:
            read_scalar(dtype, text)
        except LiteralError as e:
            self.fail(pos, f"constant %{name}: {e}")

    def signature(self) -> None:
        """``(p0: f32[], p1: f32[2]) -> f32[]``: checked for form, not kept (the parameter
        instructions carry the same information)."""
        self.pos += 1
        self.ws()
        if self.peek() == ")":
            self.pos += 1
        else:
            while True:
                self.name("parameter name in computation signature")
                self.expect(":", "expected ':' after parameter name in computation signature")
                self.ws()
                self.shape()
                self.ws()
                c = self.peek()
                self.pos += 1
                if c == ")":
                    break
                if c != ",":
                    self.fail(self.pos - 1, "expected ',' or ')' in computation signature")
                self.ws()
        self.ws()
        if not self.s.startswith("->", self.pos):
            self.fail(self.pos, "expected '->' and the result shape after computation parameters")
        self.pos += 2
        self.ws()
        self.shape()

    def computation(self) -> Computation:
        start = self.pos
        is_entry = self.keyword("ENTRY")
        if is_entry:
            self.ws()
        name, _ = self.name("computation name")
        self.ws()
        if self.peek() == "(":
            self.signature()
        self.ws()
        if self.peek() != "{":
            self.fail(self.pos, f"expected '{{' to start computation %{name}")
        self.pos += 1
        instructions: list[Instruction] = []
        defined: dict[str, Instruction] = {}
        root: Instruction | None = None
        while True:
            self.ws()
            if self.pos >= self.n:
                self.fail(self.pos, f"expected '}}' to close computation %{name} before end of input")
            if self.s[self.pos] == "}":
                self.pos += 1
                break
            ipos = self.pos
            inst = self.instruction(name, defined)
            if inst.name in defined:
                self.fail(ipos, f"duplicate instruction name %{inst.name} in computation %{name}")
            if inst.is_root:
                if root is not None:
                    self.fail(ipos, f"computation %{name} has a second ROOT (first: %{root.name})")
                root = inst
            defined[inst.name] = inst
            instructions.append(inst)
        if not instructions:
            self.fail(start, f"computation %{name} has no instructions")
        if root is None:
            instructions[-1].is_root = True  # XLA's rule: without ROOT the last instruction is the root
        # Non-main-thread computations print `}, execution_thread="..."`; nothing the IR keeps.
        self.attributes("computation %", name)
        return Computation(name=name, instructions=instructions, is_entry=is_entry, loc=self.loc(start))

    def section(self, title: str) -> str:
        """A stack-frame table: lines ``<id> <string or {...}>``; returned as raw text."""
        entries: list[str] = []
        while True:
            self.ws()
            m = _INT.match(self.s, self.pos)
            if m is None:
                return "\n".join(entries)
            estart = self.pos
            self.pos = _SPACES.match(self.s, m.end()).end()
            if self.peek() in ("", "\n"):
                self.fail(self.pos, f"expected a value after entry {m.group(0)} of {title}")
            self.value()
            entries.append(self.raw(estart, self.pos))

    def module(self) -> Module:
        self.ws()
        if self.pos >= self.n:
            self.fail(0, "no HloModule header: the input is empty")
        if not self.keyword("HloModule"):
            self.fail(self.pos, "no HloModule header: expected 'HloModule <name>'")
        self.pos = _SPACES.match(self.s, self.pos).end()
        m = _MODULE_NAME.match(self.s, self.pos)
        if m is None:
            self.fail(self.pos, "expected module name after 'HloModule'")
        module_name = m.group(0)
        self.pos = m.end()
        header: dict[str, str] = {}
        for key, raw, vpos in self.attributes("the HloModule header"):
            if key in header:
                self.fail(vpos - len(key) - 1, f"duplicate header attribute '{key}'")
            header[key] = raw
        computations: dict[str, Computation] = {}
        entry: str | None = None
        while True:
            self.ws()
            if self.pos >= self.n:
                break
            w = _WORD.match(self.s, self.pos)
            if w is not None and w.group(0) in _SECTIONS:
                after = _WS.match(self.s, w.end()).end()
                if after >= self.n or self.s[after] not in "({":
                    self.pos = w.end()
                    header[w.group(0)] = self.section(w.group(0))
                    continue
            cpos = self.pos
            comp = self.computation()
            if comp.name in computations:
                self.fail(cpos, f"duplicate computation name %{comp.name}")
            if comp.is_entry:
                if entry is not None:
                    self.fail(cpos, f"second ENTRY computation %{comp.name} (first: %{entry})")
                entry = comp.name
            computations[comp.name] = comp
        if not computations:
            self.fail(self.pos, f"module {module_name} has no computations")
        if entry is None:
            entry = next(reversed(computations))
            computations[entry].is_entry = True
        for comp_name, vpos, key, value, raw in self.calls:
            for callee in [value] if isinstance(value, str) else value:
                if callee not in computations:
                    at = re.search(r"%?(?<![\w.\-])" + re.escape(callee) + r"(?![\w.\-])", raw)
                    self.fail(
                        vpos + (at.start() if at else 0),
                        f"{key} names computation %{callee}, which is not defined (in computation %{comp_name})",
                    )
        _resolve_stack_frames(header, computations)
        return Module(
            name=module_name, computations=computations, entry_name=entry, header=header, path=self.path
        )


@gc_paused()
def parse_hlo(text: str, path: str = "<string>") -> Module:
    """Parse HLO module text; ``path`` is only used in locations and error messages."""
    return _Parser(text, path).module()


def parse_hlo_file(path: str | os.PathLike[str]) -> Module:
    """Parse an HLO text file; the path is stored as given (a relative path stays relative)."""
    p = os.fspath(path)
    try:
        with open(p, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as e:
        raise InputError(p, "", f"cannot read HLO file: {e.strerror or e}") from e
    return parse_hlo(text, p)
