"""Tests for bijection inference; numpy's reshape/transpose semantics are the oracle."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import pairwise, permutations, product
from math import prod

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardproof.engine.analysis.bijection import Layout, infer_bijection

Chain = list[tuple[str, tuple[int, ...]]]
PROPERTY = settings(max_examples=300, deadline=None)


# -- numpy oracle ---------------------------------------------------------------------------


def run_chain(x: np.ndarray, chain: Chain) -> np.ndarray:
    for kind, arg in chain:
        x = x.reshape(arg) if kind == "reshape" else x.transpose(arg)
    return x


def run_ops(x: np.ndarray, ops: list[str]) -> np.ndarray:
    """Execute the printed form, so the text of ``ops()`` itself is checked, not just steps."""
    for op in ops:
        kind, _, rest = op.partition("(")
        args = tuple(int(v) for v in rest.rstrip(")").split(",") if v)
        x = x.reshape(args) if kind == "reshape" else x.transpose(args)
    return x


def factorizations(n: int) -> Iterator[tuple[int, ...]]:
    """Ordered factorizations of n into factors >= 2 (the empty one for n == 1)."""
    if n == 1:
        yield ()
        return
    for f in range(2, n + 1):
        if n % f == 0:
            for rest in factorizations(n // f):
                yield (f, *rest)


def prefix_products(sizes: Sequence[int]) -> set[int]:
    out, acc = set(), 1
    for s in sizes:
        acc *= s
        out.add(acc)
    return out


def triple_exists(d: np.ndarray, b: np.ndarray) -> bool:
    """Brute force: is there a split-reshape -> transpose -> merge-reshape taking d to b?"""
    for parts in product(*(factorizations(n) for n in d.shape)):
        atoms = tuple(a for part in parts for a in part)
        for perm in permutations(range(len(atoms))):
            moved = tuple(atoms[p] for p in perm)
            if not prefix_products(b.shape) <= prefix_products(moved) | {1}:
                continue  # the final reshape would not be a pure merge
            if np.array_equal(d.reshape(atoms).transpose(perm).reshape(b.shape), b):
                return True
    return False


def is_split_merge(old: tuple[int, ...], new: tuple[int, ...]) -> bool:
    """The paper's scope: a reshape whose dim boundaries refine each other's (no dim straddles)."""
    bounds = sorted(prefix_products(old) | prefix_products(new) | {1})
    return all(b % a == 0 for a, b in pairwise(bounds))


def in_scope(src: tuple[int, ...], chain: Chain) -> bool:
    shape = src
    for kind, arg in chain:
        if kind == "reshape" and not is_split_merge(shape, arg):
            return False
        shape = arg if kind == "reshape" else tuple(shape[i] for i in arg)
    return True


def assert_valid_ops(layout: Layout) -> None:
    """ops() must be executable and free of no-op steps, over canonical split/merge atoms."""
    atoms, perm = layout.atoms, layout.perm
    moved = tuple(atoms[p] for p in perm)
    assert 1 not in atoms
    if layout.numel:
        # Both reshapes of the triple only split or merge: atoms refine src and dst dims.
        assert prefix_products(layout.src) <= prefix_products(atoms) | {1}
        assert prefix_products(layout.dst) <= prefix_products(moved) | {1}
    d_cuts = prefix_products(layout.src)
    b_cuts = prefix_products(layout.dst)
    pos = {a: i for i, a in enumerate(perm)}
    for i in range(len(atoms) - 1):
        if pos[i + 1] == pos[i] + 1:
            # Adjacent in both orders: only a dim boundary on either side may keep them apart.
            d_prefix = prod(atoms[: i + 1])
            b_prefix = prod(moved[: pos[i] + 1])
            assert d_prefix in d_cuts or b_prefix in b_cuts
    shape = layout.src
    for kind, arg in layout.steps():
        if kind == "reshape":
            assert arg != shape
            shape = arg
        else:
            assert arg != tuple(range(len(arg)))
            shape = tuple(shape[i] for i in arg)
    assert shape == layout.dst


# -- strategies -----------------------------------------------------------------------------


def prime_factors(n: int) -> list[int]:
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out


def draw_shape(data: st.DataObject, max_numel: int = 24, max_rank: int = 4) -> tuple[int, ...]:
    dims: list[int] = []
    for _ in range(data.draw(st.integers(0, max_rank))):
        dims.append(data.draw(st.integers(1, min(6, max_numel // prod(dims)))))
    return tuple(dims)


def draw_reshape(data: st.DataObject, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Mostly pure splits/merges (the paper's scope), sometimes an arbitrary regrouping."""
    kind = data.draw(st.sampled_from(["split", "merge", "any"]))
    dims = list(shape)
    if kind == "merge" and len(dims) >= 2:
        i = data.draw(st.integers(0, len(dims) - 2))
        j = data.draw(st.integers(i + 2, len(dims)))
        return (*dims[:i], prod(dims[i:j]), *dims[j:])
    if kind == "split" and dims:
        i = data.draw(st.integers(0, len(dims) - 1))
        divisors = [f for f in range(1, dims[i] + 1) if dims[i] % f == 0]
        outer = data.draw(st.sampled_from(divisors))
        return (*dims[:i], outer, dims[i] // outer, *dims[i + 1 :])
    factors = data.draw(st.permutations(prime_factors(prod(shape))))
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(factors) - 1)))))
    bounds = [0, *[c for c in cuts if c < len(factors)], len(factors)]
    out = [prod(factors[a:b]) for a, b in pairwise(bounds)]
    for _ in range(data.draw(st.integers(0, 2))):
        out.insert(data.draw(st.integers(0, len(out))), 1)
    return tuple(out)


def draw_chain(
    data: st.DataObject, shape: tuple[int, ...], max_len: int = 4
) -> tuple[Chain, tuple[int, ...]]:
    chain: Chain = []
    for _ in range(data.draw(st.integers(0, max_len))):
        if data.draw(st.booleans()):
            perm = tuple(data.draw(st.permutations(range(len(shape)))))
            chain.append(("transpose", perm))
            shape = tuple(shape[i] for i in perm)
        else:
            shape = draw_reshape(data, shape)
            chain.append(("reshape", shape))
    return chain, shape


def draw_layout(data: st.DataObject, max_numel: int = 24) -> Layout:
    src = draw_shape(data, max_numel)
    chain, _ = draw_chain(data, src)
    layout = Layout.from_chain(src, chain)
    return layout if layout is not None else Layout.identity(src)


# -- required cases -------------------------------------------------------------------------


def test_paper_example() -> None:
    base = [("reshape", (256, 4096))]
    dist = [("transpose", (1, 0, 2)), ("reshape", (256, 4096))]
    layout = infer_bijection((4, 64, 4096), base, (4, 64, 4096), dist)
    assert layout is not None
    assert layout.ops() == ["reshape(64,4,4096)", "transpose(1,0,2)", "reshape(256,4096)"]
    assert layout.key() == "bij(256,4096:64,4,4096|1,0,2|256,4096)"
    assert not layout.is_identity()
    x = np.arange(4 * 64 * 4096, dtype=np.int32).reshape(4, 64, 4096)
    b1, d1 = run_chain(x, base), run_chain(x, dist)
    assert np.array_equal(layout.apply(d1), b1)
    assert np.array_equal(run_ops(d1, layout.ops()), b1)


@pytest.mark.parametrize(
    ("base_src", "base", "dist"),
    [
        ((6, 4), [("reshape", (4, 6))], []),  # boundaries at 6 and 4 refine neither way
        ((6, 4), [("transpose", (1, 0)), ("reshape", (6, 4))], []),
        ((12,), [("reshape", (3, 4))], [("reshape", (4, 3))]),
        ((2, 3), [("transpose", (1, 0))], [("reshape", (3, 2))]),
    ],
)
def test_no_bijection(base_src: tuple[int, ...], base: Chain, dist: Chain) -> None:
    assert infer_bijection(base_src, base, base_src, dist) is None
    x = np.arange(prod(base_src)).reshape(base_src)
    assert not triple_exists(run_chain(x, dist), run_chain(x, base))


def test_size_mismatch_is_none() -> None:
    assert infer_bijection((4, 6), [("reshape", (5, 5))], (4, 6), []) is None
    assert infer_bijection((4, 6), [], (4, 6), [("reshape", (4, 5))]) is None
    assert infer_bijection((4, 6), [], (6, 4), []) is None
    assert infer_bijection((4, 6), [], (4, 6), [], start=Layout.identity((6, 4))) is None


@pytest.mark.parametrize(("s", "b", "h"), [(4, 2, 8), (2, 4, 3), (8, 8, 2)])
def test_bsh_bug_is_a_non_identity_bijection(s: int, b: int, h: int) -> None:
    base = [("reshape", (s, b, h)), ("transpose", (1, 0, 2))]
    buggy = [("reshape", (b, s, h))]
    layout = infer_bijection((s * b, h), base, (s * b, h), buggy)
    assert layout is not None
    assert not layout.is_identity()
    assert layout.src == layout.dst == (b, s, h)  # same shapes, yet different contents
    x = np.arange(s * b * h).reshape(s * b, h)
    assert np.array_equal(layout.apply(run_chain(x, buggy)), run_chain(x, base))

    fixed = infer_bijection((s * b, h), base, (s * b, h), base)
    assert fixed is not None
    assert fixed.is_identity()
    assert fixed.ops() == []


def test_bsh_bug_without_common_factor_has_no_bijection() -> None:
    s, b, h = 3, 2, 4
    base = [("reshape", (s, b, h)), ("transpose", (1, 0, 2))]
    assert infer_bijection((s * b, h), base, (s * b, h), [("reshape", (b, s, h))]) is None


@pytest.mark.parametrize(
    ("src", "base", "dist"),
    [
        ((3, 5), [("transpose", (1, 0)), ("transpose", (1, 0))], []),
        ((6, 10), [("reshape", (60,))], [("reshape", (2, 30)), ("reshape", (60,))]),
        ((60,), [("reshape", (6, 10)), ("reshape", (60,))], []),
        # transpose then merge == split the merged dim differently, then transpose
        (
            (2, 3, 4),
            [("transpose", (2, 0, 1)), ("reshape", (4, 6))],
            [("reshape", (6, 4)), ("transpose", (1, 0))],
        ),
        (
            (4, 2, 3),
            [("transpose", (1, 2, 0)), ("reshape", (6, 4))],
            [("reshape", (4, 6)), ("transpose", (1, 0))],
        ),
        ((1, 4, 1), [("transpose", (2, 1, 0))], []),  # moving size-1 dims is a no-op
        ((6, 4), [("reshape", (24,)), ("reshape", (4, 6))], [("reshape", (4, 6))]),
    ],
)
def test_equal_chains_give_identity(src: tuple[int, ...], base: Chain, dist: Chain) -> None:
    layout = infer_bijection(src, base, src, dist)
    assert layout is not None
    assert layout.is_identity(), layout.ops()
    assert layout == Layout.identity(layout.src)
    assert layout.ops() == []


def test_same_chain_on_both_sides_is_identity_even_through_odd_shapes() -> None:
    # Run one side to the end first and the second transpose finds (4,6)-shaped atoms under
    # (6,4) dims; lockstep keeps every intermediate map simple.
    chain: Chain = [
        ("transpose", (1, 0)),
        ("reshape", (24,)),
        ("reshape", (6, 4)),
        ("transpose", (1, 0)),
    ]
    layout = infer_bijection((6, 4), chain, (6, 4), chain)
    assert layout is not None and layout.is_identity()


def test_noop_transpose_needs_no_alignment() -> None:
    # transpose(0,1,2) and moves of size-1 dims keep the element order: a reshape, not a cut.
    base: Chain = [
        ("reshape", (3, 5, 2)),
        ("transpose", (0, 2, 1)),
        ("reshape", (2, 3, 5)),
        ("transpose", (0, 1, 2)),
        ("reshape", (2, 1, 15)),
        ("transpose", (1, 0, 2)),
        ("reshape", (3, 1, 2, 5)),
    ]
    layout = infer_bijection((3, 5, 2, 1), base, (3, 5, 2, 1), [])
    assert layout is not None
    assert layout.ops() == ["reshape(3,5,2)", "transpose(0,2,1)", "reshape(3,1,2,5)"]


# -- API details ----------------------------------------------------------------------------


def test_identity_and_plain_reshape() -> None:
    ident = Layout.identity((2, 3))
    assert ident.is_identity() and ident.ops() == [] and str(ident) == "identity"
    merge = Layout((2, 3), (6,))
    assert not merge.is_identity()
    assert merge.ops() == ["reshape(6)"]
    assert merge.inverse().ops() == ["reshape(2,3)"]
    with pytest.raises(ValueError, match="split/merge"):
        Layout((6, 4), (4, 6))
    with pytest.raises(ValueError, match="element count"):
        Layout((6, 4), (5, 4))


def test_canonical_fields_ignore_refinement() -> None:
    coarse = Layout((6, 4), (4, 6), atoms=(6, 4), perm=(1, 0))
    fine = Layout((6, 4), (4, 6), atoms=(2, 3, 2, 2), perm=(2, 3, 0, 1))
    assert coarse == fine and hash(coarse) == hash(fine) and coarse.key() == fine.key()
    assert coarse.ops() == ["transpose(1,0)"]
    assert Layout((1, 4), (4, 1), atoms=(1, 4, 1), perm=(2, 1, 0)).is_identity() is False
    assert Layout((1, 4), (4, 1)).ops() == ["reshape(4,1)"]


def test_atoms_respect_dim_boundaries() -> None:
    # 2 and 3 travel together, but as two D dims they are split by the first reshape, not merged.
    layout = Layout.from_chain((2, 3, 5), [("transpose", (2, 0, 1)), ("reshape", (5, 6))])
    assert layout is not None
    assert (layout.atoms, layout.perm) == ((2, 3, 5), (2, 0, 1))
    assert layout.ops() == ["transpose(2,0,1)", "reshape(5,6)"]
    assert layout.key() == "bij(2,3,5:2,3,5|2,0,1|5,6)"
    assert layout.inverse().ops() == ["reshape(5,2,3)", "transpose(1,2,0)"]


def test_then_methods_follow_numpy() -> None:
    x = np.arange(24).reshape(2, 3, 4)
    layout = Layout.from_chain((2, 3, 4), [("transpose", (2, 0, 1))])
    assert layout is not None
    y = layout.apply(x)
    merged = layout.then_dst_reshape((4, 6))
    assert merged is not None and np.array_equal(merged.apply(x), y.reshape(4, 6))
    assert layout.then_dst_reshape((6, 4)) is None  # (4,2,3) -> (6,4) cuts through the 4
    assert np.array_equal(layout.then_dst_transpose((1, 2, 0)).apply(x), y.transpose(1, 2, 0))
    flat = layout.then_src_reshape((24,))
    assert flat is not None and np.array_equal(flat.apply(x.reshape(24)), y)
    assert np.array_equal(layout.then_src_transpose((1, 0, 2)).apply(x.transpose(1, 0, 2)), y)
    with pytest.raises(ValueError):
        layout.then_dst_reshape((5,))
    with pytest.raises(ValueError):
        layout.then_dst_transpose((0, 0, 1))


def test_compose_and_inverse() -> None:
    a = Layout.from_chain((4, 6), [("transpose", (1, 0))])
    assert a is not None
    assert a.compose(a.inverse()) == Layout.identity((4, 6))
    assert a.inverse().compose(a) == Layout.identity((6, 4))
    with pytest.raises(ValueError):
        a.compose(a)


def test_start_relation_is_used() -> None:
    start = Layout.from_chain((4, 6), [("transpose", (1, 0))])  # d0 (4,6) -> b0 (6,4)
    assert start is not None
    layout = infer_bijection((6, 4), [("transpose", (1, 0))], (4, 6), [], start=start)
    assert layout is not None and layout.is_identity()


def test_empty_and_scalar_tensors() -> None:
    empty = infer_bijection((0, 3), [("transpose", (1, 0))], (0, 3), [("reshape", (3, 0))])
    assert empty is not None and empty.is_identity()
    odd = Layout((0, 3), (3, 0))
    assert odd.ops() == ["reshape(3,0)"] and odd.apply(np.zeros((0, 3))).shape == (3, 0)
    scalar = infer_bijection((), [("reshape", (1, 1))], (), [("reshape", (1,))])
    assert scalar is not None and scalar.ops() == ["reshape(1,1)"]


def test_malformed_ops_raise() -> None:
    with pytest.raises(ValueError):
        Layout.from_chain((2, 3), [("reshape", (5,))])
    with pytest.raises(ValueError):
        infer_bijection((2, 3), [("reshape", (6,)), ("transpose", (1, 0))], (2, 3), [])
    with pytest.raises(ValueError):
        infer_bijection((2, 3), [("transpose", (0,))], (2, 3), [])
    with pytest.raises(ValueError):
        infer_bijection((2, 3), [("slice", (0, 1))], (2, 3), [])


# -- properties -----------------------------------------------------------------------------


@PROPERTY
@given(st.data())
def test_inferred_layout_maps_d1_to_b1_exactly_when_one_exists(data: st.DataObject) -> None:
    src = draw_shape(data)
    base, _ = draw_chain(data, src)
    dist, _ = draw_chain(data, src)
    x = np.arange(prod(src)).reshape(src)
    b1, d1 = run_chain(x, base), run_chain(x, dist)
    layout = infer_bijection(src, base, src, dist)
    if layout is None:
        # Completeness is promised for split/merge reshapes only; outside that scope the
        # paper's answer is ⊥ whenever the symbolic axes cannot be aligned.
        if in_scope(src, base) and in_scope(src, dist):
            assert not triple_exists(d1, b1)
        return
    assert (layout.src, layout.dst) == (d1.shape, b1.shape)
    assert np.array_equal(layout.apply(d1), b1)
    assert np.array_equal(run_ops(d1, layout.ops()), b1)
    assert_valid_ops(layout)
    assert layout.is_identity() == (d1.shape == b1.shape and np.array_equal(d1, b1))


@PROPERTY
@given(st.data())
def test_inference_from_a_start_relation(data: st.DataObject) -> None:
    start = draw_layout(data)
    base, _ = draw_chain(data, start.dst)
    dist, _ = draw_chain(data, start.src)
    d0 = np.arange(start.numel).reshape(start.src)
    b1, d1 = run_chain(start.apply(d0), base), run_chain(d0, dist)
    layout = infer_bijection(start.dst, base, start.src, dist, start=start)
    if layout is None:
        if in_scope(start.dst, base) and in_scope(start.src, dist):
            assert not triple_exists(d1, b1)
    else:
        assert np.array_equal(layout.apply(d1), b1)


@PROPERTY
@given(st.data())
def test_key_equal_iff_functions_equal(data: st.DataObject) -> None:
    src = draw_shape(data)
    chain1, shape = draw_chain(data, src)
    if data.draw(st.booleans()):
        # An equal function by a different route: splice in a step and its undo.
        at = data.draw(st.integers(0, len(chain1)))
        mid_shape = run_chain(np.empty(src), chain1[:at]).shape
        perm = tuple(data.draw(st.permutations(range(len(mid_shape)))))
        detour: Chain = [
            ("transpose", perm),
            ("transpose", tuple(int(i) for i in np.argsort(perm))),
            ("reshape", (prod(mid_shape),)),
            ("reshape", mid_shape),
        ]
        chain2 = chain1[:at] + detour + chain1[at:]
    else:
        chain2, _ = draw_chain(data, src)
    dst = draw_reshape(data, shape)
    l1 = Layout.from_chain(src, [*chain1, ("reshape", dst)])
    l2 = Layout.from_chain(src, [*chain2, ("reshape", dst)])
    if l1 is None or l2 is None:
        return
    x = np.arange(prod(src)).reshape(src)
    same = np.array_equal(l1.apply(x), l2.apply(x))
    assert (l1.key() == l2.key()) == same
    assert (l1 == l2) == same


@PROPERTY
@given(st.data())
def test_layout_algebra_follows_numpy(data: st.DataObject) -> None:
    layout = draw_layout(data)
    x = np.arange(layout.numel).reshape(layout.src)
    y = layout.apply(x)
    assert_valid_ops(layout)
    assert np.array_equal(layout.inverse().apply(y), x)
    assert layout.inverse().inverse() == layout

    perm = tuple(data.draw(st.permutations(range(len(layout.dst)))))
    assert np.array_equal(layout.then_dst_transpose(perm).apply(x), y.transpose(perm))
    perm = tuple(data.draw(st.permutations(range(len(layout.src)))))
    assert np.array_equal(layout.then_src_transpose(perm).apply(x.transpose(perm)), y)

    new_dst = draw_reshape(data, layout.dst)
    moved = layout.then_dst_reshape(new_dst)
    if moved is None:
        assert not triple_exists(x, y.reshape(new_dst))
    else:
        assert np.array_equal(moved.apply(x), y.reshape(new_dst))
    new_src = draw_reshape(data, layout.src)
    moved = layout.then_src_reshape(new_src)
    if moved is None:
        assert not triple_exists(x.reshape(new_src), y)
    else:
        assert np.array_equal(moved.apply(x.reshape(new_src)), y)

    chain, _ = draw_chain(data, layout.dst)
    other = Layout.from_chain(layout.dst, chain)
    if other is not None:
        both = layout.compose(other)
        z = other.apply(y)
        if both is None:
            assert not triple_exists(x, z)
        else:
            assert np.array_equal(both.apply(x), z)


@PROPERTY
@given(st.data())
def test_same_chain_on_both_sides_is_identity(data: st.DataObject) -> None:
    src = draw_shape(data)
    chain, _ = draw_chain(data, src, max_len=6)  # any reshapes, in scope or not
    layout = infer_bijection(src, chain, src, chain)
    assert layout is not None and layout.is_identity() and layout.ops() == []
