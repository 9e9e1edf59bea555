"""``.shardproof.yml``: the test models a repository declares.

Loading never imports torch. Every error is an :class:`InputError` naming the file, the line,
the key path (``models[3].tp``) and what was expected, whether it comes from the JSON Schema
shipped with the package (``shardproof.schema.json``) or from a check the schema cannot say
(unique names, groups of equal size, a compilable layer pattern).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..errors import InputError
from ..yamltext import LocatedLoader, check_nesting
from .schema import key_text, validate

DEFAULT_TIMEOUT = 300.0
DEFAULT_MEMORY_MB = 16384
CONFIG_NAME = ".shardproof.yml"
# Bounds on what a config may ask for, so that a typo or a corrupt file is a clear error rather
# than a hang or a crash while loading it.
MAX_VALUES = 50_000  # values with aliases expanded: "billion laughs" files stop here
MAX_RANKS = 65536  # tp: a group [0 .. tp-1] is built as a list
MAX_TIMEOUT = 7 * 24 * 3600.0  # seconds; also rejects .inf and .nan, which pass "> 0"


@dataclass
class ModelConfig:
    """One declared model with the defaults applied."""

    name: str
    entry: str
    groups: list[list[int]]
    key: str  # "models[3]", for messages
    line: int | None = None
    key_lines: dict[str, int] = field(default_factory=dict)  # "entry", "size.hidden" -> line
    size: dict[str, Any] = field(default_factory=dict)
    own_size: list[str] = field(default_factory=list)  # knobs set by the model itself
    variant: str | None = None
    expect: str | None = None
    outputs: list[Any] | None = None
    timeout: float = DEFAULT_TIMEOUT
    memory_mb: int = DEFAULT_MEMORY_MB
    layer_pattern: str | None = None
    verify: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    description: str = ""
    reference: str = ""
    rank: str = "traced"  # "int": per-rank builds, lifted (frontend/torchdist)
    framework: str = "torch-xla"  # "jax", "torch-xla-spmd": frontend/jax, frontend/spmd (groups from the mesh)
    devices: int = 8  # framework: jax / torch-xla-spmd: virtual CPU devices of the build

    @property
    def tp(self) -> int:
        return len(self.groups[0])


@dataclass
class Config:
    path: Path  # absolute
    root: Path  # absolute repository root
    python_path: list[Path]
    hide_frames: list[str]
    models: list[ModelConfig]
    source_packages: list[str] = field(default_factory=list)
    framework: str = "torch-xla"

    def where(self, model: ModelConfig, key: str) -> str:
        """``file:line: models[3].entry`` for messages about ``key`` of ``model``."""
        line = model.key_lines.get(key) or model.key_lines.get(key.split(".")[0]) or model.line
        return f"{self.display_path}:{line}: {model.key}.{key}" if line else f"{self.display_path}: {model.key}.{key}"

    def relative(self, path: Path | str) -> str:
        """``path`` relative to the repository root when inside it, else as given."""
        p = Path(path).absolute()
        try:
            return p.relative_to(self.root).as_posix()
        except ValueError:
            return str(p)

    @property
    def display_path(self) -> str:
        return self.relative(self.path)

    def select(self, names: list[str] | None) -> list[ModelConfig]:
        """The models named (in config order), or all; an unknown name is a usage error."""
        if not names:
            return list(self.models)
        known = {m.name for m in self.models}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise InputError(self.display_path, "models", f"no model named {', '.join(unknown)}; declared: {', '.join(m.name for m in self.models)}")
        wanted = set(names)
        return [m for m in self.models if m.name in wanted]


def find_config(start: Path | None = None) -> Path:
    """``.shardproof.yml`` in ``start`` or the nearest folder above it."""
    here = (start or Path.cwd()).absolute()
    for folder in (here, *here.parents):
        candidate = folder / CONFIG_NAME
        if candidate.is_file():
            return candidate
    raise InputError(str(start or "."), "", f"no {CONFIG_NAME} here or in any parent folder (use --config)")


def git_root(start: Path) -> Path | None:
    for folder in (start, *start.parents):
        if (folder / ".git").exists():
            return folder
    return None


def load_config(path: Path | str) -> Config:
    path = Path(path).absolute()
    shown = _shown(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise InputError(shown, "", f"cannot read the configuration: {e.strerror}") from e
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        column = len(raw[raw.rfind(b"\n", 0, e.start) + 1 : e.start].decode("utf-8", "replace")) + 1
        raise InputError(shown, f"{line}:{column}", f"not UTF-8 text (byte 0x{raw[e.start]:02x})") from e
    data, node = _read_yaml(text, shown)
    return parse_config(data, path, _key_lines(node))


def _read_yaml(text: str, shown: str) -> tuple[Any, yaml.Node | None]:
    """The data and the node tree (for line numbers) of one YAML document, or an InputError."""
    check_nesting(text, shown)
    loader: LocatedLoader | None = None
    try:
        loader = LocatedLoader(text)  # refuses characters YAML does not allow (NUL, ...) right here
        node = loader.get_single_node()
        if node is not None:
            _check_size(node, shown)
        return (loader.construct_document(node) if node is not None else None), node
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        if mark is not None:
            where = f"{mark.line + 1}:{mark.column + 1}"
        elif isinstance(e, yaml.reader.ReaderError):  # a character YAML does not allow
            line, column = text.count("\n", 0, e.position) + 1, e.position - text.rfind("\n", 0, e.position)
            where = f"{line}:{column}"
        else:
            where = ""
        # The first line only: a ReaderError goes on with PyYAML's '"<unicode string>", position'.
        problem = getattr(e, "problem", None) or str(e).split("\n", 1)[0]
        raise InputError(shown, where, f"not valid YAML: {problem}") from e
    except RecursionError as e:  # block nesting (indentation) hundreds of levels deep
        raise InputError(shown, "", "not valid YAML: nested too deeply to read") from e
    finally:
        if loader is not None:
            loader.dispose()


def _check_size(root: yaml.Node, shown: str) -> None:
    """Refuse aliases that expand to more than MAX_VALUES values, or that contain themselves:
    everything after loading walks the expanded data."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()

    def size(n: yaml.Node) -> int:
        if id(n) in sizes:
            return sizes[id(n)]
        if id(n) in open_:
            raise InputError(shown, f"{n.start_mark.line + 1}", "not valid here: an alias refers to a value that contains the alias")
        open_.add(id(n))
        if isinstance(n, yaml.MappingNode):
            kids = [c for pair in n.value for c in pair]
        elif isinstance(n, yaml.SequenceNode):
            kids = list(n.value)
        else:
            kids = []
        total = 1
        for k in kids:
            total += size(k)
            if total > MAX_VALUES:
                raise InputError(shown, f"{n.start_mark.line + 1}", f"too large: more than {MAX_VALUES} values once aliases are expanded")
        open_.discard(id(n))
        sizes[id(n)] = total
        return total

    size(root)


def parse_config(data: Any, path: Path, lines: dict[tuple[str | int, ...], int] | None = None) -> Config:
    """Check ``data`` (the parsed YAML of ``path``) and apply defaults."""
    lines = lines or {}
    shown = _shown(path)

    def fail(key_path: tuple[str | int, ...], message: str) -> InputError:
        line = _line_of(lines, key_path)
        # YAML keys can be null, booleans, floats or dates (`null: 1`); key_text takes str | int.
        key = key_text(tuple(p if isinstance(p, str) or type(p) is int else _yaml_word(p) for p in key_path))
        where = str(line) if line else ""
        return InputError(shown, where, f"{key}: {message}" if key else message)

    errors = validate(data)
    if errors:
        # Every schema error at once, each with its line: one run shows all there is to fix.
        raise _all([fail(e.path, e.message) for e in errors])
    problems: list[InputError] = []  # the checks below also report every error, not the first
    assert isinstance(data, dict)
    root = _root(data, path, fail)
    python_path = []
    for index, folder in enumerate(data.get("python_path", ["."])):
        resolved = _folder(path.parent, folder)
        if resolved is None:
            problems.append(fail(("python_path", index), f"expected a folder relative to {path.name}; {folder!r} does not exist"))
            continue
        python_path.append(resolved)
    for index, pattern in enumerate(data.get("hide_frames", [])):
        if pattern.startswith("/") or ".." in Path(pattern).parts:
            problems.append(fail(("hide_frames", index), f"expected a glob relative to the repository root, got {pattern!r}"))
    defaults = data.get("defaults", {})
    framework = data.get("framework", "torch-xla")
    try:
        _check_settings(defaults, ("defaults",), fail)
        _check_framework(defaults, ("defaults",), framework, fail)
    except InputError as e:
        problems.append(e)
    models: list[ModelConfig] = []
    seen: dict[str, int] = {}
    for index, raw in enumerate(data["models"]):
        key_path: tuple[str | int, ...] = ("models", index)
        if raw["name"] in seen:
            problems.append(fail((*key_path, "name"), f"expected a unique name; {raw['name']!r} is also models[{seen[raw['name']]}]"))
            continue
        seen[raw["name"]] = index
        try:
            _check_settings(raw, key_path, fail)
            _check_framework(raw, key_path, framework, fail)
        except InputError as e:
            problems.append(e)
            continue
        merged = copy.deepcopy(defaults)
        for key, value in raw.items():
            if key in ("size", "env", "verify"):
                merged[key] = {**merged.get(key, {}), **value}
            elif key in ("tp", "groups"):
                # A model's own degree replaces the default one, whichever way either is given.
                merged.pop("tp", None)
                merged.pop("groups", None)
                merged[key] = value
            else:
                merged[key] = value
        if framework in MESH_FRAMEWORKS:
            groups = []  # the build derives them from the model's mesh and its group axes
        elif "tp" in merged:
            groups = [list(range(merged["tp"]))]
        elif "groups" in merged:
            groups = merged["groups"]
        else:
            problems.append(fail(key_path, "expected 'tp' or 'groups' (in the model or in defaults)"))
            continue
        models.append(
            ModelConfig(
                name=merged["name"],
                entry=merged["entry"],
                groups=groups,
                key=key_text(key_path),
                line=_line_of(lines, key_path),
                key_lines={key_text(p[2:]): n for p, n in lines.items() if p[:2] == key_path and len(p) > 2},
                size=dict(merged.get("size", {})),
                own_size=sorted(raw.get("size", {})),
                variant=merged.get("variant"),
                expect=merged.get("expect"),
                outputs=merged.get("outputs"),
                timeout=float(merged.get("timeout", DEFAULT_TIMEOUT)),
                memory_mb=int(merged.get("memory_mb", DEFAULT_MEMORY_MB)),
                layer_pattern=merged.get("layer_pattern"),
                verify=dict(merged.get("verify", {})),
                env=dict(merged.get("env", {})),
                description=merged.get("description", ""),
                reference=merged.get("reference", ""),
                rank=merged.get("rank", "traced"),
                framework=framework,
                devices=int(merged.get("devices", 8)),
            )
        )
    if problems:
        raise _all(problems)
    return Config(path, root, python_path, list(data.get("hide_frames", [])), models, list(data.get("source_packages", [])), framework)


def _all(problems: list[InputError]) -> InputError:
    """One error for all ``problems``: the first, then each other one on a line of its own."""
    first = problems[0]
    return InputError(first.path, first.where, first.message + "".join(f"\n{e}" for e in problems[1:]), first.excerpt)


def _yaml_word(value: Any) -> str:
    """A non-string key as YAML spells it."""
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _shown(path: Path) -> str:
    """The config's path as messages show it: relative to the working folder when inside it."""
    try:
        return path.relative_to(Path.cwd()).as_posix()
    except ValueError:
        return str(path)


def _folder(base: Path, name: str) -> Path | None:
    """``base / name`` resolved, if it is a folder (a NUL byte or a symlink loop is not one)."""
    try:
        resolved = (base / name).resolve()
        return resolved if resolved.is_dir() else None
    except (OSError, ValueError, RuntimeError):
        return None


def _root(data: dict[str, Any], path: Path, fail: Any) -> Path:
    if "root" in data:
        root = _folder(path.parent, data["root"])
        if root is None:
            raise fail(("root",), f"expected a folder relative to {path.name}; {data['root']!r} does not exist")
        return root
    return (git_root(path.parent.resolve()) or path.parent).resolve()


# Keys that only some frameworks read: a key the build would ignore is refused, never dropped.
MESH_FRAMEWORKS = ("jax", "torch-xla-spmd")  # groups and relations from a mesh and specs
_TORCH_ONLY = ("tp", "groups", "outputs", "rank", "layer_pattern")
_MESH_ONLY = ("devices",)


def _check_framework(settings: dict[str, Any], key_path: tuple[str | int, ...], framework: str, fail: Any) -> None:
    mesh = framework in MESH_FRAMEWORKS
    for key in _TORCH_ONLY if mesh else _MESH_ONLY:
        if key in settings:
            why = "the model's groups, output relations and rank come from its mesh and specs" if mesh else "it sets the virtual devices of framework: jax / torch-xla-spmd builds"
            raise fail((*key_path, key), f"not a key of framework: {framework} ({why})")


def _check_settings(settings: dict[str, Any], key_path: tuple[str | int, ...], fail: Any) -> None:
    """What the schema cannot say about tp/groups, layer_pattern, timeouts and knob names."""
    if "tp" in settings and "groups" in settings:
        raise fail((*key_path, "groups"), "expected either 'tp' or 'groups', not both")
    if settings.get("tp", 0) > MAX_RANKS:
        raise fail((*key_path, "tp"), f"expected at most {MAX_RANKS} ranks, got {settings['tp']}")
    for timeout_path in (("timeout",), ("verify", "timeout")):
        value: Any = settings
        for part in timeout_path:
            value = value.get(part) if isinstance(value, dict) else None
        # Checked as a number: float() of a huge integer overflows, and inf/nan pass "> 0".
        if value is not None and not value <= MAX_TIMEOUT:
            raise fail((*key_path, *timeout_path), f"expected at most {MAX_TIMEOUT:.0f} seconds (a week), got {str(value)[:40]}")
    for mapping in ("size", "env"):
        # YAML reads `on:`, `1:` or `2024-01-01:` as a boolean, a number or a date, not a name.
        for key in settings.get(mapping, {}):
            if not isinstance(key, str):
                raise fail((*key_path, mapping, key), f"expected a name, got {_yaml_word(key)}; quote it to make it one")
    groups = settings.get("groups")
    if groups is not None:
        sizes = {len(g) for g in groups}
        if len(sizes) != 1:
            raise fail((*key_path, "groups"), f"expected groups of one size, got sizes {sorted(sizes)}")
        flat = [r for g in groups for r in g]
        if len(set(flat)) != len(flat):
            raise fail((*key_path, "groups"), "expected every rank in one group only")
        if sorted(flat) != list(range(len(flat))):
            raise fail((*key_path, "groups"), f"expected the groups to cover ranks 0..{len(flat) - 1} exactly")
    pattern = settings.get("layer_pattern")
    if pattern is not None:
        try:
            compiled = re.compile(pattern)
        except (re.error, OverflowError, RecursionError) as e:  # a{4294967296}, ((((...))))
            raise fail((*key_path, "layer_pattern"), f"expected a regular expression: {e}") from e
        if compiled.groups < 1:
            raise fail((*key_path, "layer_pattern"), "expected a regular expression whose group 1 captures the layer number")


# --------------------------------------------------------------------------------------------
# Line numbers: the composed YAML node tree, walked alongside the data.


def _key_lines(node: yaml.Node | None) -> dict[tuple[str | int, ...], int]:
    lines: dict[tuple[str | int, ...], int] = {}

    def walk(n: yaml.Node, path: tuple[str | int, ...]) -> None:
        lines.setdefault(path, n.start_mark.line + 1)
        if isinstance(n, yaml.MappingNode):
            for key_node, value_node in n.value:
                if key_node.value == "<<":
                    merged = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
                    for m in merged:
                        walk(m, path)
                    continue
                key = (*path, key_node.value)
                lines[key] = key_node.start_mark.line + 1
                walk(value_node, key)
        elif isinstance(n, yaml.SequenceNode):
            for index, item in enumerate(n.value):
                walk(item, (*path, index))

    if node is not None:
        walk(node, ())
    return lines


def _line_of(lines: dict[tuple[str | int, ...], int], key_path: tuple[str | int, ...]) -> int | None:
    """The line of ``key_path``, or of its nearest ancestor the file spells out."""
    for end in range(len(key_path), -1, -1):
        if key_path[:end] in lines:
            return lines[key_path[:end]]
    return None
