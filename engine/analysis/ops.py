"""Opcode classes the analysis knows (which law families may apply to which opcode)."""

from __future__ import annotations

UNARY_POINTWISE = frozenset(
    {
        "abs", "negate", "exponential", "exponential-minus-one", "log", "log-plus-one", "sqrt",
        "rsqrt", "cbrt", "tanh", "logistic", "sine", "cosine", "tan", "erf", "floor", "ceil",
        "round-nearest-afz", "round-nearest-even", "sign", "not", "is-finite", "convert",
        "bitcast-convert", "reduce-precision", "copy", "real", "imag", "popcnt",
        "count-leading-zeros",
    }
)  # fmt: skip
BINARY_POINTWISE = frozenset(
    {
        "add", "subtract", "multiply", "divide", "maximum", "minimum", "power", "remainder",
        "atan2", "and", "or", "xor", "compare", "shift-left", "shift-right-arithmetic",
        "shift-right-logical", "complex",
    }
)  # fmt: skip
TERNARY_POINTWISE = frozenset({"select", "clamp"})
COMMUTATIVE = frozenset({"add", "multiply", "maximum", "minimum", "and", "or", "xor"})
# Unary maps that are non-decreasing on every input commute with max (and min) over ranks:
# max_r f(a_r) = f(max_r a_r). Not sqrt/log/log-plus-one (NaN below their domain breaks it) and
# not convert in general (pred and wrapping int converts are not monotone): see
# monotone_convert for the converts that are.
MONOTONE = frozenset({"exponential", "tanh", "logistic", "copy", "cbrt", "exponential-minus-one", "floor", "ceil"})
FLOAT_TYPES = frozenset({"f16", "bf16", "f32", "f64", "f8e5m2", "f8e4m3fn"})
INT_WIDTHS = {"s8": 8, "s16": 16, "s32": 32, "s64": 64, "u8": 8, "u16": 16, "u32": 32, "u64": 64}


def monotone_convert(src: str, dst: str) -> bool:
    """Converts that never reverse an order: float→float and int→float round monotonically;
    int→int only when every value fits (no wrap-around)."""
    if dst in FLOAT_TYPES:
        return src in FLOAT_TYPES or src in INT_WIDTHS
    if src in INT_WIDTHS and dst in INT_WIDTHS:
        if src[0] == dst[0]:
            return INT_WIDTHS[dst] >= INT_WIDTHS[src]
        return src[0] == "u" and dst[0] == "s" and INT_WIDTHS[dst] > INT_WIDTHS[src]
    return False
SHAPE_OPS = frozenset({"reshape", "transpose", "broadcast", "slice", "pad", "concatenate", "reverse"})
STRUCTURED = frozenset({"dot", "reduce", "gather", "dynamic-slice", "dynamic-update-slice", "iota", "constant", "parameter", "custom-call", "scatter"})
COLLECTIVES = frozenset({"all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute"})
LEAVES = frozenset({"parameter", "constant", "iota", "replica-id", "partition-id"})

# sort and get-tuple-element only obey the duplicate law (same op on identical inputs).
WINDOW = frozenset({"reduce-window"})  # rules/window.egg
KNOWN = UNARY_POINTWISE | BINARY_POINTWISE | TERNARY_POINTWISE | SHAPE_OPS | STRUCTURED | COLLECTIVES | LEAVES | WINDOW | {"tuple", "sort", "topk", "get-tuple-element"}

# Attributes that never change the value an instruction computes. Not here, because they do:
# is_stable (an unstable sort orders tied keys as it likes), indices_are_sorted and
# unique_indices (promises: a gather or scatter whose indices break them is implementation-
# defined), operand_precision/precision_config (DEFAULT is a bf16 pass on TPU: a rounding like
# a convert to bf16) and result_accuracy (the tolerance of a transcendental op). signature.py
# drops their default values, so a written default and an absent one give the same key.
# channel_id and use_global_device_ids choose how replica_groups name devices; they are neutral
# because a collective relates only when its groups equal the sharding groups, and every
# reading of groups that equal them (replicas, partitions, flattened ids) names the same ranks
# when the program runs on one replica of c partitions or c replicas of one partition.
VALUE_NEUTRAL_ATTRS = frozenset(
    {
        "metadata", "sharding", "frontend_attributes", "channel_id", "backend_config",
        "statistics", "origin", "schedule", "use_global_device_ids", "constrain_layout",
        "custom_call_has_side_effect", "api_version",
    }
)  # fmt: skip
# Attributes the analysis reads itself (typed), rather than as verbatim text.
TYPED_ATTRS = frozenset({"replica_groups", "to_apply", "source_target_pairs"})
