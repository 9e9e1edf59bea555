"""Symbolic bijection inference between a distributed tensor and its baseline tensor.

When the baseline and the distributed program reach the "same" tensor through different
reshape/transpose chains, relation propagation alone cannot relate them. Following Scalify's
``infer_bijection_expressions`` we instead compute, symbolically, the element bijection that maps
the distributed tensor ``D`` onto the baseline tensor ``B`` and express it as the paper's
``bijection(s1, p, s2)``: reshape ``D`` to ``s1``, transpose by ``p``, reshape to ``B``'s shape.

Representation. ``D``'s elements are indexed by a list of *atoms* (symbolic axes with a size),
listed in ``D``'s row-major order; ``B`` orders the very same atoms by a permutation. Every ``D``
dim is the ``⊗`` of a consecutive run of atoms in ``D`` order and every ``B`` dim the ``⊗`` of a
consecutive run in ``B`` order, so both reshapes of the triple only split or merge dimensions
(the paper's scope assumption). The four steps of the paper map onto this as follows:

1. symbolize: a reshape that merges dims turns their atoms into one run (``⊗``), a reshape that
   splits a dim splits an atom into an outer and an inner atom;
2. normalize ranks: both sides are refined to one common atom list (``_split``);
3. match: the permutation is read off as the position of each ``B`` atom in ``D`` order;
4. emit: ``reshape(atoms) -> transpose(perm) -> reshape(dst)``, dropping no-op steps.

Rather than building both expressions and matching them at the end, the chains are folded into
the running bijection one op at a time, which yields the same triple. Reshapes keep the flat
element order and so never fail on their own; a transpose is the only op whose block boundaries
must line up with the atoms of the bijection computed so far, and the final shapes must line up
with the final atoms. Which intermediate maps are met depends on how the two chains interleave,
so ``infer_bijection`` searches the interleavings (a small grid) before answering ⊥.

Canonical form. Size-1 atoms carry no information and are dropped. Two atoms adjacent in both
orders are merged unless a ``D`` dim boundary or a ``B`` dim boundary separates them. What is left
is the coarsest atom list that refines the maximally merged permutation (which is determined by the
element map alone) by the dim boundaries of ``src`` and ``dst``, so two layouts are equal as
functions exactly when their canonical fields are equal; ``key()`` and ``==`` rely on this.

Pure tuple arithmetic: numpy is imported only inside :meth:`Layout.apply`, the test oracle.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from math import prod
from typing import Any, NamedTuple

Shape = tuple[int, ...]
ChainOp = tuple[str, Sequence[int]]


def _as_shape(value: Iterable[int], what: str) -> Shape:
    # operator.index rejects floats and numpy floats that would silently truncate.
    dims = tuple(operator.index(d) for d in value)
    if any(d < 0 for d in dims):
        raise ValueError(f"{what} has a negative dimension: {dims}")
    return dims


def _as_perm(value: Iterable[int], rank: int) -> Shape:
    perm = tuple(operator.index(i) for i in value)
    if sorted(perm) != list(range(rank)):
        raise ValueError(f"{perm} is not a permutation of the {rank} dims")
    return perm


def _inverse(perm: Sequence[int]) -> Shape:
    inv = [0] * len(perm)
    for pos, atom in enumerate(perm):
        inv[atom] = pos
    return tuple(inv)


def _runs(shape: Shape, sizes: Sequence[int]) -> list[tuple[int, int]] | None:
    """Half-open atom ranges forming each dim of ``shape``, or None if a dim cuts an atom.

    ``sizes`` must be free of size-1 atoms: a size-1 dim then owns the empty run, which keeps
    the runs unique.
    """
    runs = []
    i = 0
    for dim in shape:
        start, acc = i, 1
        while acc < dim and i < len(sizes):
            acc *= sizes[i]
            i += 1
        if acc != dim:
            return None
        runs.append((start, i))
    return runs


def _cuts(shape: Shape, sizes: Sequence[int]) -> set[int]:
    runs = _runs(shape, sizes)
    if runs is None:  # callers split first, so this is an internal invariant
        raise AssertionError(f"atoms {tuple(sizes)} do not refine shape {shape}")
    return {end for _, end in runs[:-1]}


def _drop_unit_atoms(sizes: Sequence[int], perm: Sequence[int]) -> tuple[Shape, Shape]:
    new_index: dict[int, int] = {}
    kept: list[int] = []
    for i, size in enumerate(sizes):
        if size != 1:
            new_index[i] = len(kept)
            kept.append(size)
    return tuple(kept), tuple(new_index[a] for a in perm if a in new_index)


def _merge(
    sizes: Sequence[int], perm: Sequence[int], src: Shape | None, dst: Shape | None
) -> tuple[Shape, Shape]:
    """Merge atoms adjacent in both orders, keeping the dim boundaries of the shapes given.

    Passing None for a shape forgets its boundaries: that is how a reshape of one side frees
    the atoms before they are re-split for the new shape.
    """
    sizes, perm = _drop_unit_atoms(sizes, perm)
    pos = _inverse(perm)
    d_cuts = _cuts(src, sizes) if src is not None else set()
    b_cuts = _cuts(dst, [sizes[a] for a in perm]) if dst is not None else set()
    merged: list[int] = []
    group = [0] * len(sizes)
    for i, size in enumerate(sizes):
        if i and pos[i] == pos[i - 1] + 1 and i not in d_cuts and pos[i] not in b_cuts:
            merged[-1] *= size
        else:
            merged.append(size)
        group[i] = len(merged) - 1
    new_perm: list[int] = []
    for atom in perm:
        # A merged group is consecutive in B order too, so it shows up as a repeated entry.
        if not new_perm or new_perm[-1] != group[atom]:
            new_perm.append(group[atom])
    return tuple(merged), tuple(new_perm)


def _split(
    sizes: Sequence[int], perm: Sequence[int], shape: Shape, on_src: bool
) -> tuple[Shape, Shape] | None:
    """Split atoms so each dim of ``shape`` is a run of atoms in the D (or B) order.

    Each split is forced (the outer part must equal the dim's remaining size), so when the input
    is the coarsest valid atom list, None means no refinement exists at all: the reshape is not a
    pure split/merge relative to the bijection.
    """
    size_list, perm_list = list(sizes), list(perm)
    k = 0  # position in the side's order
    for dim in shape:
        acc = 1
        while acc < dim:
            atom = k if on_src else perm_list[k]
            size = size_list[atom]
            need = dim // acc  # exact: acc only ever grows by divisors of the remaining size
            if need % size == 0:
                acc *= size
            elif size % need == 0:
                # Row-major split: outer part first in both orders, inner part right after it.
                size_list[atom : atom + 1] = [need, size // need]
                perm_list = [a + 1 if a > atom else a for a in perm_list]
                perm_list.insert(perm_list.index(atom) + 1, atom + 1)
                acc *= need
            else:
                return None
            k += 1
    return tuple(size_list), tuple(perm_list)


def _parse_chain(src: Shape, chain: Iterable[ChainOp]) -> list[tuple[str, Shape]] | None:
    """Validate a chain and fuse runs of reshapes and of transposes.

    Fusing only removes intermediate shapes, and every intermediate transpose is a place where
    the bijection's atoms must line up with dims, so the fused chain succeeds at least as often.
    Returns None when a reshape changes the element count; malformed ops raise ValueError.
    """
    ops: list[tuple[str, Shape]] = []
    shape = src
    for kind, arg in chain:
        if kind == "reshape":
            new_shape = _as_shape(arg, "reshape target")
            if prod(new_shape) != prod(shape):
                return None
            if ops and ops[-1][0] == "reshape":
                ops.pop()
            ops.append(("reshape", new_shape))
            shape = new_shape
        elif kind == "transpose":
            perm = _as_perm(arg, len(shape))
            shape = tuple(shape[d] for d in perm)
            if ops and ops[-1][0] == "transpose":
                # XLA semantics: out dim i = in dim perm[i], so the second runs through the first.
                first = ops.pop()[1]
                perm = tuple(first[i] for i in perm)
            ops.append(("transpose", perm))
        else:
            raise ValueError(f"unknown layout op {kind!r}; expected 'reshape' or 'transpose'")
    return ops


class _Map(NamedTuple):
    """A bijection in working form: atoms need not line up with the dims of src or dst.

    Reshapes never fail here (they keep the flat element order), which lets a chain pass
    through intermediate shapes that only the final shapes make representable, e.g.
    ``(6,4) -> (24) -> (4,6)``. Only transposes need the atoms to line up with dims.
    """

    src: Shape
    dst: Shape
    sizes: Shape
    perm: Shape

    def reshape(self, shape: Shape, on_src: bool) -> _Map:
        return self._replace(src=shape) if on_src else self._replace(dst=shape)

    def transpose(self, tperm: Shape, on_src: bool) -> _Map | None:
        shape = self.src if on_src else self.dst
        new_shape = tuple(shape[d] for d in tperm)
        if prod(shape) == 0:
            return self.reshape(new_shape, on_src)
        # A transpose moves blocks of dims that stay together and in order (size-1 dims go
        # anywhere), so only the block boundaries must fall between atoms. Treat it as
        # reshape(blocks) -> transpose -> reshape: a no-op transpose then needs no alignment.
        blocks, bperm = _merge(shape, tperm, None, None)
        if bperm == tuple(range(len(bperm))):
            return self.reshape(new_shape, on_src)
        moved = self.reshape(blocks, on_src)._transpose_aligned(blocks, bperm, on_src)
        return None if moved is None else moved.reshape(new_shape, on_src)

    def _transpose_aligned(self, shape: Shape, tperm: Shape, on_src: bool) -> _Map | None:
        # Coarsest atoms first, so a failed split really means a block boundary cuts a factor.
        split = _split(*_merge(self.sizes, self.perm, None, None), shape, on_src)
        if split is None:
            return None
        sizes, perm = split
        new_shape = tuple(shape[d] for d in tperm)
        if on_src:
            runs = _runs(shape, sizes)
            assert runs is not None
            order = [i for d in tperm for i in range(*runs[d])]
            new_index = _inverse(order)
            return _Map(
                new_shape,
                self.dst,
                tuple(sizes[i] for i in order),
                tuple(new_index[a] for a in perm),
            )
        runs = _runs(shape, [sizes[a] for a in perm])
        assert runs is not None
        new_perm = tuple(perm[j] for d in tperm for j in range(*runs[d]))
        return _Map(self.src, new_shape, sizes, new_perm)

    def step(self, op: tuple[str, Shape], on_src: bool) -> _Map | None:
        """Apply one validated op (see ``_parse_chain``) to one side."""
        kind, arg = op
        return self.reshape(arg, on_src) if kind == "reshape" else self.transpose(arg, on_src)

    def follow(self, ops: Iterable[tuple[str, Shape]], on_src: bool) -> _Map | None:
        result: _Map | None = self
        for op in ops:
            result = result.step(op, on_src)
            if result is None:
                return None
        return result


def _normal_form(src: Shape, dst: Shape, sizes: Shape, perm: Shape) -> tuple[Shape, Shape] | None:
    if prod(src) == 0:
        return (), ()  # every map between empty tensors is the same (empty) function
    # Start from the coarsest permutation (a function of the element map alone), refine it by
    # both sides' dim boundaries, then merge back whatever those boundaries do not separate.
    coarse = _merge(sizes, perm, None, None)
    split = _split(*coarse, src, on_src=True)
    if split is not None:
        split = _split(*split, dst, on_src=False)
    if split is None:
        return None
    return _merge(*split, src, dst)


def _fmt(values: Sequence[int]) -> str:
    return ",".join(map(str, values))


@dataclass(frozen=True)
class Layout:
    """A reshape–transpose–reshape bijection from a distributed tensor to its baseline.

    ``atoms`` are the symbolic axis sizes in ``src``'s row-major order and ``perm`` lists them in
    ``dst``'s order (``perm[i]`` is the ``src``-order index of the ``i``-th ``dst``-order atom).
    Any refinement may be passed in; the fields are stored in canonical form, so ``==`` and
    ``hash`` compare the functions. Leaving ``atoms`` and ``perm`` empty means a plain reshape.
    Construction raises ValueError when the element map has no split/merge-only triple.
    """

    src: Shape
    dst: Shape
    atoms: Shape = ()
    perm: Shape = ()

    def __post_init__(self) -> None:
        src = _as_shape(self.src, "src")
        dst = _as_shape(self.dst, "dst")
        if prod(src) != prod(dst):
            raise ValueError(f"src {src} and dst {dst} differ in element count")
        atoms = _as_shape(self.atoms, "atoms")
        perm = tuple(self.perm)
        if not atoms and not perm:
            atoms, perm = (prod(src),), (0,)
        elif prod(src) != 0:
            perm = _as_perm(perm, len(atoms))
            if prod(atoms) != prod(src):
                raise ValueError(f"atoms {atoms} do not multiply to the {prod(src)} elements")
        form = _normal_form(src, dst, atoms, perm)
        if form is None:
            raise ValueError(
                f"no reshape-transpose-reshape of split/merge reshapes maps {src} to {dst} "
                f"with atoms {atoms} and perm {perm}"
            )
        # Frozen dataclass: canonicalize in place once, so equality is plain field equality.
        object.__setattr__(self, "src", src)
        object.__setattr__(self, "dst", dst)
        object.__setattr__(self, "atoms", form[0])
        object.__setattr__(self, "perm", form[1])

    # -- construction ---------------------------------------------------------------------

    @staticmethod
    def identity(shape: Iterable[int]) -> Layout:
        shape = _as_shape(shape, "shape")
        return Layout(shape, shape)

    @staticmethod
    def from_chain(src: Iterable[int], chain: Iterable[ChainOp]) -> Layout | None:
        """The layout mapping ``x`` to ``chain(x)``; None if the result has no triple form."""
        src = _as_shape(src, "src")
        ops = _parse_chain(src, chain)
        if ops is None:
            raise ValueError(f"a reshape in {chain} changes the element count of {src}")
        result = _Map(src, src, (prod(src),), (0,)).follow(ops, on_src=False)
        return None if result is None else Layout._attempt(result)

    @staticmethod
    def _attempt(m: _Map) -> Layout | None:
        form = _normal_form(m.src, m.dst, m.sizes, m.perm)
        return None if form is None else Layout(m.src, m.dst, *form)

    def _map(self) -> _Map:
        return _Map(self.src, self.dst, self.atoms, self.perm)

    # -- queries --------------------------------------------------------------------------

    @property
    def numel(self) -> int:
        return prod(self.src)

    def is_identity(self) -> bool:
        # Canonical atoms of an identity map are in order; anything else moves some element.
        return self.src == self.dst and self.perm == tuple(range(len(self.perm)))

    def key(self) -> str:
        """Canonical text, equal for two layouts exactly when they are the same function."""
        return f"bij({_fmt(self.src)}:{_fmt(self.atoms)}|{_fmt(self.perm)}|{_fmt(self.dst)})"

    def steps(self) -> list[tuple[str, Shape]]:
        """The triple as chain ops ``("reshape", shape)`` / ``("transpose", perm)``, no no-ops."""
        if self.is_identity():
            return []
        if self.perm == tuple(range(len(self.perm))):
            return [("reshape", self.dst)]  # same element order, only the shape differs
        out: list[tuple[str, Shape]] = []
        if self.atoms != self.src:
            out.append(("reshape", self.atoms))
        out.append(("transpose", self.perm))
        if tuple(self.atoms[a] for a in self.perm) != self.dst:
            out.append(("reshape", self.dst))
        return out

    def ops(self) -> list[str]:
        return [f"{kind}({_fmt(arg)})" for kind, arg in self.steps()]

    def __str__(self) -> str:
        return " -> ".join(self.ops()) or "identity"

    # -- algebra --------------------------------------------------------------------------

    def then_dst_reshape(self, new_dst: Iterable[int]) -> Layout | None:
        """Map ``D`` to ``reshape(B, new_dst)``; None if that is no longer a split/merge triple."""
        new_dst = _as_shape(new_dst, "reshape target")
        if prod(new_dst) != self.numel:
            raise ValueError(f"cannot reshape {self.dst} to {new_dst}")
        return Layout._attempt(self._map().reshape(new_dst, on_src=False))

    def then_src_reshape(self, new_src: Iterable[int]) -> Layout | None:
        """Map ``reshape(D, new_src)`` to ``B``; None if that is no longer a split/merge triple."""
        new_src = _as_shape(new_src, "reshape target")
        if prod(new_src) != self.numel:
            raise ValueError(f"cannot reshape {self.src} to {new_src}")
        return Layout._attempt(self._map().reshape(new_src, on_src=True))

    def then_dst_transpose(self, perm: Iterable[int]) -> Layout:
        """Map ``D`` to ``transpose(B, perm)`` (XLA: output dim i is input dim ``perm[i]``)."""
        return self._transposed(_as_perm(perm, len(self.dst)), on_src=False)

    def then_src_transpose(self, perm: Iterable[int]) -> Layout:
        """Map ``transpose(D, perm)`` to ``B`` (XLA: output dim i is input dim ``perm[i]``)."""
        return self._transposed(_as_perm(perm, len(self.src)), on_src=True)

    def _transposed(self, perm: Shape, on_src: bool) -> Layout:
        moved = self._map().transpose(perm, on_src)
        # Canonical atoms already refine both shapes, and permuting whole dims keeps that.
        result = None if moved is None else Layout._attempt(moved)
        assert result is not None, "a transpose of a canonical layout is always representable"
        return result

    def inverse(self) -> Layout:
        return Layout(
            self.dst, self.src, tuple(self.atoms[a] for a in self.perm), _inverse(self.perm)
        )

    def compose(self, other: Layout) -> Layout | None:
        """``self``: D -> B and ``other``: B -> C give D -> C (None if it has no triple form)."""
        if self.dst != other.src:
            raise ValueError(f"cannot compose: {self.dst} is not the source {other.src}")
        result = self._map().follow(other.steps(), on_src=False)
        return None if result is None else Layout._attempt(result)

    def apply(self, array: Any) -> Any:
        """Numerically map an array of shape ``src`` to shape ``dst`` (the tests' oracle)."""
        import numpy as np  # lazy: the engine itself stays numpy-free

        arr = np.asarray(array)
        if arr.shape != self.src:
            raise ValueError(f"expected an array of shape {self.src}, got {arr.shape}")
        for kind, arg in self.steps():
            arr = arr.reshape(arg) if kind == "reshape" else arr.transpose(arg)
        return arr


def infer_bijection(
    base_src: Iterable[int],
    base_chain: Iterable[ChainOp],
    dist_src: Iterable[int],
    dist_chain: Iterable[ChainOp],
    start: Layout | None = None,
) -> Layout | None:
    """The layout mapping ``d1 = dist_chain(d0)`` to ``b1 = base_chain(b0)``.

    ``start`` maps ``d0`` (shape ``dist_src``) to ``b0`` (shape ``base_src``); None means they are
    the same tensor. Chains hold ``("reshape", shape)`` and ``("transpose", perm)`` ops.

    Returns None when no split/merge reshape–transpose–reshape relates ``d1`` and ``b1`` (the
    paper's ⊥), when a reshape changes the element count, or when the shapes do not fit
    ``start``. Malformed ops (unknown kind, invalid permutation) raise ValueError.
    """
    base_src = _as_shape(base_src, "base_src")
    dist_src = _as_shape(dist_src, "dist_src")
    # Parse both chains up front so malformed ops raise even when the search stops early.
    base_ops = _parse_chain(base_src, base_chain)
    dist_ops = _parse_chain(dist_src, dist_chain)
    if base_ops is None or dist_ops is None:
        return None
    if start is None:
        if base_src != dist_src:
            return None
        start = Layout.identity(dist_src)
    elif start.src != dist_src or start.dst != base_src:
        return None
    # Cell (i, j) stands for the map from dist_ops[:i](d0) to base_ops[:j](b0); which map that
    # is does not depend on the route taken, but whether a transpose's blocks line up with its
    # atoms does: running the same chain on both sides works in lockstep, yet fails when one
    # side is run to the end first. So search all interleavings; chains are short.
    row: list[_Map | None] = []
    for i in range(len(dist_ops) + 1):
        prev, row = row, []
        for j in range(len(base_ops) + 1):
            cell: _Map | None = start._map() if i == j == 0 else None
            if i and prev[j] is not None:
                cell = prev[j].step(dist_ops[i - 1], on_src=True)
            if cell is None and j and row[j - 1] is not None:
                cell = row[j - 1].step(base_ops[j - 1], on_src=False)
            row.append(cell)
    final = row[-1]
    return None if final is None else Layout._attempt(final)
