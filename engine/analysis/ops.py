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
# Non-decreasing unary maps commute with max over ranks: max_r f(a_r) = f(max_r a_r).
MONOTONE = frozenset({"exponential", "log", "sqrt", "tanh", "logistic", "convert", "copy", "cbrt", "exponential-minus-one", "log-plus-one", "floor", "ceil"})
SHAPE_OPS = frozenset({"reshape", "transpose", "broadcast", "slice", "pad", "concatenate", "reverse"})
STRUCTURED = frozenset({"dot", "reduce", "gather", "dynamic-slice", "dynamic-update-slice", "iota", "constant", "parameter", "custom-call", "scatter"})
COLLECTIVES = frozenset({"all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute"})
LEAVES = frozenset({"parameter", "constant", "iota", "replica-id", "partition-id"})

# sort and get-tuple-element only obey the duplicate law (same op on identical inputs).
KNOWN = UNARY_POINTWISE | BINARY_POINTWISE | TERNARY_POINTWISE | SHAPE_OPS | STRUCTURED | COLLECTIVES | LEAVES | {"tuple", "sort", "get-tuple-element"}

# Attributes that never change the value an instruction computes.
VALUE_NEUTRAL_ATTRS = frozenset(
    {
        "metadata", "sharding", "frontend_attributes", "channel_id", "backend_config",
        "statistics", "origin", "schedule", "operand_precision", "precision_config",
        "indices_are_sorted", "unique_indices", "use_global_device_ids", "constrain_layout",
        "is_stable", "custom_call_has_side_effect", "api_version", "result_accuracy",
    }
)  # fmt: skip
# Attributes the analysis reads itself (typed), rather than as verbatim text.
TYPED_ATTRS = frozenset({"replica_groups", "to_apply", "source_target_pairs"})
