"""Capture the HLO text and a source map of pending torch-xla tensors.

This is the one place that turns lazy XLA tensors into what the engine reads: HLO text (with
``XLA_HLO_DEBUG=1`` metadata) and ``sourcemap.json``, which keeps the *whole* Python stack of
every instruction, restricted to the user's repository, because the text's metadata only names
the innermost frame (often inside torch or torch_xla).

torch and torch_xla are imported inside the functions: importing this module must stay cheap,
since ``shardproof check`` never needs torch.
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
import struct
import sysconfig
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

SOURCEMAP_VERSION = 1

# Name of the lowering; torch-xla's own text dump names its entry computation the same, so the
# computation names of the text and of the JSON agree.
_LOWERING_NAME = "IrToHlo"

_PACKAGE_DIRS = ("site-packages", "dist-packages")

# Scopes the front end pushes while autograd runs (build._autograd_sites): ``backward`` marks
# an instruction of the backward pass (the verifier cuts the backward at layer boundaries in
# reverse order by it), and ``shardproof_site_<i>`` names the forward call it differentiates.
# The site marker never reaches the files: capture() strips it and gives the instruction the
# site's frames instead.
BACKWARD_SCOPE = "backward"
SITE_SCOPE = "shardproof_site_"
_SITE_SEGMENT = re.compile(rf"^{SITE_SCOPE}(\d+)(?:\.\d+)?$")


@dataclass
class Site:
    """A forward call that made autograd nodes: its Python stack (innermost first, absolute
    paths) and the innermost module path running it."""

    stack: list[tuple[str, int, str]]
    module: str


def _split_site(op_name: str) -> tuple[str, int | None]:
    """``op_name`` without its site marker, and the site it names (None: no marker)."""
    if SITE_SCOPE not in op_name:
        return op_name, None
    site = None
    kept = []
    for segment in op_name.split("/"):
        m = _SITE_SEGMENT.match(segment)
        if m:
            site = int(m.group(1))
        else:
            kept.append(segment)
    return "/".join(kept), site


def configure_environment(device: str = "CPU") -> None:
    """Set what torch-xla reads once at import time; call before the first ``import torch_xla``.

    Without ``XLA_HLO_DEBUG`` the lowering records neither metadata nor stack frames.
    """
    os.environ.setdefault("PJRT_DEVICE", device)
    os.environ["XLA_HLO_DEBUG"] = "1"


def keep_scalars_constant() -> None:
    """Make Python scalars other than 0 and 1 lower to constants, not ``f32[]`` parameters.

    A scalar parameter would make every attention scale or epsilon an input that the verifier
    would have to relate by hand.
    """
    import torch_xla

    torch_xla._XLAC._set_xla_all_numbers_special_scalars(True)


def reset_collective_token() -> None:
    """Forget the token torch-xla threads through token-carrying collectives.

    The token is per-device state: after one traced graph used ``xm.all_reduce`` or
    ``xm.all_gather``, the next graph would otherwise thread the previous graph's collective
    result into its own and silently contain both programs.
    """
    import torch_xla

    torch_xla._XLAC._set_all_reduce_token(str(torch_xla.device()), None)


def placeholder(shape: Sequence[int], dtype: Any) -> Any:
    """A lazy XLA tensor that lowers to a ``parameter`` without allocating a buffer."""
    from torch_xla.core import xla_builder

    return xla_builder.create_placeholder_tensor(tuple(shape), dtype)


# --------------------------------------------------------------------------------------------
# Paths: nothing of the machine that produced the capture may leak into the files.


def _package_relative(parts: Sequence[str]) -> str | None:
    """The part after the last site-packages/dist-packages component, if any."""
    for index in range(len(parts) - 1, -1, -1):
        if parts[index] in _PACKAGE_DIRS:
            return "/".join(parts[index + 1 :])
    return None


def is_repository_file(path: str, root: Path) -> bool:
    """True for a file of the user's repository, false for installed packages inside it.

    A virtual environment often lives inside the repository, so "under the root" alone would
    count torch's own files as the user's.
    """
    if not path.startswith("/"):
        return False
    pure = PurePosixPath(path)
    try:
        relative = pure.relative_to(PurePosixPath(str(root)))
    except ValueError:
        return False
    return _package_relative(relative.parts) is None


def in_packages(path: str, packages: Sequence[str]) -> bool:
    """Whether ``path`` is a file of one of the installed ``packages`` (top-level names)."""
    if not packages or not path.startswith("/"):
        return False
    relative = _package_relative(PurePosixPath(path).parts)
    return relative is not None and relative.split("/", 1)[0] in packages


def portable_path(path: str, root: Path) -> str:
    """A path that names no directory of this machine.

    Repository files become root-relative; installed packages ``<site-packages>/pkg/...``; the
    standard library ``<stdlib>/...``; anything else keeps only its file name.
    """
    if not path.startswith("/"):
        return path  # "<string>", "<frozen ...>" and the like carry no machine path
    pure = PurePosixPath(path)
    packaged = _package_relative(pure.parts)
    if packaged is not None:
        return f"<site-packages>/{packaged}"
    try:
        return str(pure.relative_to(PurePosixPath(str(root))))
    except ValueError:
        pass
    stdlib = sysconfig.get_paths().get("stdlib")
    if stdlib:
        try:
            return f"<stdlib>/{pure.relative_to(PurePosixPath(stdlib))}"
        except ValueError:
            pass
    return f"<external>/{pure.name}"


# --------------------------------------------------------------------------------------------
# op_name scopes carry a process-wide counter ("aten__mul.17/aten__mul"): renumber them per
# graph so that the same program captured in another process prints the same text.

_SCOPE_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\.(\d+)(?=/|$)")


@dataclass
class _ScopeNumbering:
    numbers: dict[str, int] = field(default_factory=dict)

    def learn(self, op_name: str) -> None:
        for segment in op_name.split("/"):
            match = _SCOPE_RE.fullmatch(segment)
            if match and segment not in self.numbers:
                self.numbers[segment] = len(self.numbers) + 1

    def apply(self, op_name: str) -> str:
        out = []
        for segment in op_name.split("/"):
            match = _SCOPE_RE.fullmatch(segment)
            if match:
                if segment not in self.numbers:
                    raise RuntimeError(f"op_name scope {segment!r} absent from the HLO text")
                segment = f"{match.group(1)}.{self.numbers[segment]}"
            out.append(segment)
        return "/".join(out)


# --------------------------------------------------------------------------------------------
# The HLO text as torch-xla prints it; only what is needed to cross-check it with the JSON.

_COMPUTATION_RE = re.compile(r"^(?:ENTRY )?%(\S+) \(")
_INSTRUCTION_RE = re.compile(r"^\s+(?:ROOT )?%(\S+) = (.*)$")
_OP_NAME_RE = re.compile(r'op_name="([^"]*)"')
_SOURCE_FILE_RE = re.compile(r'source_file="([^"]*)"')
_SOURCE_LINE_RE = re.compile(r"source_line=(\d+)")


def _text_instructions(text: str) -> dict[str, dict[str, str]]:
    """computation name -> {instruction name -> the rest of its line}."""
    out: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for line in text.splitlines():
        header = _COMPUTATION_RE.match(line)
        if header:
            current = out.setdefault(header.group(1), {})
            continue
        instruction = _INSTRUCTION_RE.match(line)
        if instruction and current is not None:
            current[instruction.group(1)] = instruction.group(2)
    return out


def _check_same_lowering(text: str, module: dict[str, Any]) -> None:
    """Fail unless the text and the JSON describe the same instructions.

    They come from two lowerings of the same pending graph; torch-xla numbers instructions
    deterministically, and this check is what makes the source map trustworthy for the text.
    """
    in_text = _text_instructions(text)
    in_json = {
        comp["name"]: {ins["name"]: ins for ins in comp.get("instructions", [])}
        for comp in module.get("computations", [])
    }
    if set(in_text) != set(in_json):
        raise RuntimeError(
            f"HLO text and JSON differ in computations: {sorted(in_text)} vs {sorted(in_json)}"
        )
    for comp_name, instructions in in_json.items():
        text_instructions = in_text[comp_name]
        if set(text_instructions) != set(instructions):
            missing = sorted(set(instructions) ^ set(text_instructions))
            raise RuntimeError(f"HLO text and JSON differ in {comp_name}: {missing[:8]}")
        for name, instruction in instructions.items():
            rest = text_instructions[name]
            if f" {instruction['opcode']}(" not in rest:
                raise RuntimeError(f"{name}: opcode {instruction['opcode']} not in the text")
            line = instruction.get("metadata", {}).get("sourceLine")
            found = _SOURCE_LINE_RE.search(rest)
            if line is not None and (found is None or int(found.group(1)) != int(line)):
                raise RuntimeError(f"{name}: source line differs between text and JSON")


# --------------------------------------------------------------------------------------------
# Literals in full. torch-xla's text printer (XLA's HloModule::ToString with default options)
# writes a constant of more than 10 elements as ``{...}``: two different tables (rotary
# frequencies, arange steps) would read the same, and the verifier can only call such a
# constant unknown. The JSON of the same lowering holds every value; each elided literal of the
# text is rewritten from it, in XLA's literal syntax.

_ELIDED_RE = re.compile(r"^(\s+(?:ROOT )?%(\S+) = .*? constant\()\{\.\.\.\}(\).*)$")

# LiteralProto's JSON field per element type: (field, struct format of one element when the
# field is bytes, or None when it is a list of numbers/strings/bools).
_LITERAL_FIELDS: dict[str, tuple[str, str | None]] = {
    "pred": ("preds", None),
    "s8": ("s8s", "<b"), "u8": ("u8s", "<B"), "s16": ("s16s", "<h"), "u16": ("u16s", "<H"),
    "s32": ("s32s", None), "u32": ("u32s", None), "s64": ("s64s", None), "u64": ("u64s", None),
    "f16": ("f16s", "<e"), "bf16": ("bf16s", "<H"), "f32": ("f32s", None), "f64": ("f64s", None),
}  # fmt: skip
_JSON_FLOATS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _round_float(dtype: str, v: float) -> float:
    """``v`` rounded to float type ``dtype`` the way XLA's parser reads a decimal (double, then
    float, then the narrow type, nearest-even each time)."""
    if dtype == "f64" or not math.isfinite(v):
        return v
    try:
        f = struct.unpack("<f", struct.pack("<f", v))[0]
    except OverflowError:
        return math.copysign(math.inf, v)
    if dtype == "f16":
        try:
            return float(struct.unpack("<e", struct.pack("<e", f))[0])
        except OverflowError:
            return math.copysign(math.inf, f)
    if dtype == "bf16":
        bits = struct.unpack("<I", struct.pack("<f", f))[0]
        if (bits >> 23) & 0xFF == 0xFF:
            return f
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return float(struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0]) if bits <= 0xFFFFFFFF else math.copysign(math.inf, f)
    return float(f)


# Like XLA's RoundTripFpToString: ``%g`` with the digits every value of the type keeps
# (C++ digits10) when that reads back exactly, else with enough digits for every value
# (max_digits10); bf16 and f16 always with max_digits10. Texts then match XLA's own printing
# (tests/test_frontend_literals.py), except that -0 is written "-0.0".
_DIGITS = {"bf16": (4, 4), "f16": (5, 5), "f32": (6, 9), "f64": (15, 17)}


def _float_text(dtype: str, v: float) -> str:
    """A decimal that XLA's parser reads back as exactly ``v`` in ``dtype``."""
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if v == 0 and math.copysign(1.0, v) < 0:
        return "-0.0"  # XLA reads "-0" as the integer 0, i.e. +0
    short, full = _DIGITS[dtype]
    text = f"{v:.{short}g}"
    return text if _round_float(dtype, float(text)) == v else f"{v:.{full}g}"


def _literal_values(literal: dict[str, Any], dtype: str) -> list[str] | None:
    """Every element of a LiteralProto (as JSON) in XLA's text form, or None for a type or
    encoding read here not at all (the constant then stays elided: unknown to the verifier)."""
    if dtype not in _LITERAL_FIELDS:
        return None
    name, fmt = _LITERAL_FIELDS[dtype]
    raw = literal.get(name, [] if fmt is None else "")
    if fmt is not None:
        data = base64.b64decode(raw)
        size = struct.calcsize(fmt)
        if len(data) % size:
            return None
        values = [v for (v,) in struct.iter_unpack(fmt, data)]
        if dtype == "bf16":
            values = [struct.unpack("<f", struct.pack("<I", v << 16))[0] for v in values]
    else:
        values = list(raw)
    if dtype == "pred":
        return ["1" if v else "0" for v in values]  # XLA prints pred elements as 1 / 0
    if dtype in ("f16", "bf16", "f32", "f64"):
        return [_float_text(dtype, float(_JSON_FLOATS.get(v, v)) if isinstance(v, str) else float(v)) for v in values]
    return [str(int(v)) for v in values]


def literal_text(literal: dict[str, Any], dtype: str, dims: Sequence[int]) -> str | None:
    """The literal of a LiteralProto (JSON) of element type ``dtype`` and shape ``dims`` as
    XLA's parser reads it (``{ {1, 2}, {3, 4} }``), or None when it cannot be written."""
    values = _literal_values(literal, dtype)
    count = 1
    for d in dims:
        count *= d
    if values is None or len(values) != count:
        return None
    if not dims:
        return values[0]

    if len(dims) == 1:
        return "{" + ", ".join(values) + "}"

    def nest(start: int, rank: int) -> str:  # XLA pads every brace of a rank >= 2 literal
        if rank == len(dims) - 1:
            return "{ " + ", ".join(values[start : start + dims[rank]]) + " }"
        stride = 1
        for d in dims[rank + 1 :]:
            stride *= d
        return "{ " + ", ".join(nest(start + i * stride, rank + 1) for i in range(dims[rank])) + " }"

    return nest(0, 0)


def _full_literals(text: str, module: dict[str, Any]) -> str:
    """``text`` with every ``constant({...})`` written out from the lowering's JSON."""
    if "{...}" not in text:
        return text
    constants: dict[str, dict[str, dict[str, Any]]] = {
        comp["name"]: {ins["name"]: ins for ins in comp.get("instructions", []) if ins.get("opcode") == "constant"}
        for comp in module.get("computations", [])
    }
    lines = text.split("\n")
    current: dict[str, dict[str, Any]] = {}
    for i, line in enumerate(lines):
        header = _COMPUTATION_RE.match(line)
        if header:
            current = constants.get(header.group(1), {})
            continue
        m = _ELIDED_RE.match(line)
        if m is None or m.group(2) not in current:
            continue
        ins = current[m.group(2)]
        shape = ins.get("shape", {})
        full = literal_text(ins.get("literal", {}), _element_type(shape), [int(d) for d in shape.get("dimensions", [])])
        if full is not None:
            lines[i] = m.group(1) + full + m.group(3)
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------


@dataclass
class Capture:
    """One lowering of a set of output tensors."""

    hlo_text: str
    sourcemap: dict[str, Any]
    parameter_shapes: dict[int, tuple[str, tuple[int, ...]]]
    _context: Any = field(repr=False)

    def parameter_number(self, tensor: Any) -> int:
        """The ``parameter(N)`` that ``tensor`` (a placeholder or device tensor) became."""
        number = int(self._context.tensor_parameter_id(tensor))
        if number < 0:
            raise ValueError("tensor is not a parameter of the captured graph (unused input?)")
        return number


def _element_type(shape: dict[str, Any]) -> str:
    return str(shape.get("elementType", "")).lower()


def _resolved_files(index: dict[str, Any]) -> list[str]:
    """The index's file names; absolute ones resolved, so a repository reached through a
    symlink still counts."""
    return [os.path.realpath(f) if f.startswith("/") else f for f in index.get("fileNames", [])]


_REAL: dict[str, str] = {}


def real(path: str) -> str:
    """``path`` resolved like the frame index's file names (cached: a stack repeats its files)."""
    if path not in _REAL:
        _REAL[path] = os.path.realpath(path) if path.startswith("/") else path
    return _REAL[path]


def _walk_frames(frame_id: int, index: dict[str, Any], files: list[str] | None = None) -> list[tuple[str, int, str]]:
    """(file, line, function) from the innermost frame outwards; ids in the proto are 1-based.

    ``files`` is ``_resolved_files(index)``, computed once per module by the caller.
    """
    files = files if files is not None else _resolved_files(index)
    functions = index.get("functionNames", [])
    locations = index.get("fileLocations", [])
    frames = index.get("stackFrames", [])
    out: list[tuple[str, int, str]] = []
    seen: set[int] = set()
    while frame_id and frame_id not in seen:  # proto3 JSON omits a zero parent: the outermost
        seen.add(frame_id)
        frame = frames[frame_id - 1]
        location = locations[int(frame.get("fileLocationId", 0)) - 1]
        file_name = files[int(location.get("fileNameId", 0)) - 1]
        function_id = int(location.get("functionNameId", 0))
        function = functions[function_id - 1] if function_id else ""
        out.append((file_name, int(location.get("line", 0)), function))
        frame_id = int(frame.get("parentFrameId", 0))
    return out


def capture(
    outputs: Iterable[Any], root: Path | str, exclude: Iterable[Path | str] = (), sites: Sequence[Site] = (), packages: Sequence[str] = ()
) -> Capture:
    """Lower ``outputs`` to HLO text plus a source map whose frames are repository files.

    ``root`` is the repository root: frames outside it (and inside any site-packages below it)
    are dropped from the source map, and every path in the text is rewritten to name no
    directory of this machine. Frames of the files in ``exclude`` (a tracing driver, say) are
    dropped too, so that the map names the model code only. An instruction of the backward pass
    whose op_name names one of ``sites`` gets that forward call's frames and ``"backward": true``
    in the map (its own stack is autograd's thread: torch internals at best).
    """
    import torch_xla

    root = Path(root).resolve()
    excluded = {str(Path(path).resolve()) for path in exclude}
    tensors = list(outputs)
    context = torch_xla._XLAC.lowering.LoweringContext(_LOWERING_NAME)
    context.build(tensors)
    module = json.loads(context.hlo_json())
    raw_text = torch_xla._XLAC._get_xla_tensors_hlo(tensors)
    if "metadata={" not in raw_text:
        raise RuntimeError("HLO has no metadata: set XLA_HLO_DEBUG=1 before importing torch_xla")
    _check_same_lowering(raw_text, module)
    raw_text = _full_literals(raw_text, module)

    numbering = _ScopeNumbering()
    for match in _OP_NAME_RE.finditer(raw_text):
        numbering.learn(_split_site(match.group(1))[0])
    text = _OP_NAME_RE.sub(lambda m: f'op_name="{numbering.apply(_split_site(m.group(1))[0])}"', raw_text)
    shown: dict[str, str] = {}

    def show(path: str) -> str:
        if path not in shown:
            shown[path] = portable_path(path, root)
        return shown[path]

    text = _SOURCE_FILE_RE.sub(lambda m: f'source_file="{show(m.group(1))}"', text)
    if not text.endswith("\n"):
        text += "\n"

    frame_index = module.get("stackFrameIndex", {})
    files = _resolved_files(frame_index)
    # Instructions share stack frames (every op of a layer's line, say): resolve each frame
    # chain and each file once, not once per instruction.
    kept_files: dict[str, str | None] = {}
    chains: dict[int, list[dict[str, Any]]] = {}

    def user_file(file_name: str) -> str | None:
        if file_name not in kept_files:
            keep = (is_repository_file(file_name, root) or in_packages(file_name, packages)) and file_name not in excluded
            kept_files[file_name] = portable_path(file_name, root) if keep else None
        return kept_files[file_name]

    def user_frames(frame_id: int) -> list[dict[str, Any]]:
        if frame_id not in chains:
            chains[frame_id] = [
                {"file": shown, "line": line, "function": function}
                for file_name, line, function in _walk_frames(frame_id, frame_index, files)
                if (shown := user_file(file_name)) is not None
            ]
        return chains[frame_id]

    site_chains: dict[int, list[dict[str, Any]]] = {}

    def site_frames(site: int) -> list[dict[str, Any]]:
        if site not in site_chains:
            site_chains[site] = [
                {"file": shown, "line": line, "function": function}
                for file_name, line, function in sites[site].stack
                if (shown := user_file(real(file_name))) is not None
            ]
        return site_chains[site]

    # torch-xla writes the innermost Python frame into each instruction's metadata, which under
    # a front end's TorchFunctionMode (torchdist's shims) is the mode's own line for every op.
    # Where that frame is an excluded file, the text names instead what the source map names
    # (its innermost user frame) or, without one, the innermost frame outside the excluded
    # files (a library's), or nothing.
    shown_frame: dict[int, tuple[str, int] | None] = {}

    def outside_excluded(frame_id: int) -> tuple[str, int] | None:
        if frame_id not in shown_frame:
            shown_frame[frame_id] = next(((show(f), line) for f, line, _ in _walk_frames(frame_id, frame_index, files) if f not in excluded and not f.startswith("<frozen")), None)
        return shown_frame[frame_id]

    located: dict[str, tuple[str, int] | None] = {}
    instructions: dict[str, Any] = {}
    parameter_shapes: dict[int, tuple[str, tuple[int, ...]]] = {}
    entry_id = module.get("entryComputationId")
    for computation in module.get("computations", []):
        is_entry = computation.get("id") == entry_id
        for instruction in computation.get("instructions", []):
            if is_entry and instruction["opcode"] == "parameter":
                shape = instruction.get("shape", {})
                dims = tuple(int(d) for d in shape.get("dimensions", []))
                number = int(instruction.get("parameterNumber", 0))
                parameter_shapes[number] = (_element_type(shape), dims)
            metadata = instruction.get("metadata")
            if not metadata:
                continue
            op_name, site = _split_site(metadata.get("opName", ""))
            frame_id = int(metadata.get("stackFrameId", 0))
            if site is not None and 0 <= site < len(sites):
                entry = {"frames": site_frames(site), "op_name": numbering.apply(op_name), "backward": True}
            else:
                entry = {"frames": user_frames(frame_id), "op_name": numbering.apply(op_name)}  # frames shared, never mutated
            instructions[instruction["name"]] = entry
            first = entry["frames"][0] if entry["frames"] else None
            located[instruction["name"]] = (first["file"], first["line"]) if first else outside_excluded(frame_id)
    # Hidden files as the text names them: the verifier skips them in HLO metadata as well (an
    # instruction the map lacks, e.g. one part of a split all-reduce, falls back to metadata).
    hidden = sorted({show(path) for path in excluded})
    text = _located(text, located, frozenset(hidden))
    sourcemap = {"version": SOURCEMAP_VERSION, "instructions": instructions, "hidden": hidden}
    return Capture(text, sourcemap, parameter_shapes, context)


_LOCATION_RE = re.compile(r' source_file="[^"]*" source_line=\d+| source_file="[^"]*"| source_line=\d+')


def _located(text: str, located: dict[str, tuple[str, int] | None], hidden: frozenset[str]) -> str:
    """``text`` where an instruction's metadata names a ``hidden`` file: its
    ``source_file``/``source_line`` set to ``located``'s (removed where it is None), so that a
    reader of the metadata alone names the line the source map names. Metadata naming any other
    file is left as torch-xla wrote it."""
    if not hidden:
        return text
    lines = text.split("\n")
    for i, line in enumerate(lines):
        m = _INSTRUCTION_RE.match(line)
        if m is None or m.group(1) not in located or "metadata={" not in line:
            continue
        named = _SOURCE_FILE_RE.search(line)
        if named is None or named.group(1) not in hidden:
            continue
        place = located.get(m.group(1))
        where = f' source_file="{place[0]}" source_line={place[1]}' if place else ""
        head, _, meta = line.rpartition("metadata={")
        body, brace, rest = meta.partition("}")
        body = _LOCATION_RE.sub("", body)
        lines[i] = f"{head}metadata={{{body}{where}{brace}{rest}"
    return "\n".join(lines)


def capture_hlo(
    outputs: Iterable[Any], root: Path | str, exclude: Iterable[Path | str] = ()
) -> tuple[str, dict[str, Any]]:
    """``(hlo_text, sourcemap)`` of ``outputs``; see :func:`capture`."""
    result = capture(outputs, root, exclude)
    return result.hlo_text, result.sourcemap


def dump_sourcemap(sourcemap: dict[str, Any]) -> str:
    """The source map as JSON text, one instruction per line so that diffs stay readable."""
    entries = [
        f"  {json.dumps(name)}: {json.dumps(entry)}"
        for name, entry in sourcemap["instructions"].items()
    ]
    body = ",\n".join(entries)
    instructions = f"{{\n{body}\n }}" if entries else "{}"
    hidden = f',\n "hidden": {json.dumps(sourcemap["hidden"])}' if sourcemap.get("hidden") else ""
    return f'{{\n "version": {json.dumps(sourcemap["version"])},\n "instructions": {instructions}{hidden}\n}}\n'


def parameter_number(captured: Capture, tensor: Any) -> int:
    """The parameter number ``tensor`` got in ``captured`` (for writing relations by number)."""
    return captured.parameter_number(tensor)
