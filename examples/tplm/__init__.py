"""tplm: a small Megatron-style tensor/sequence/expert-parallel framework for shardproof's
examples. Models are written once; a :class:`~tplm.parallel.Parallel` state of degree 1 gives
the single-device baseline, degree ``c`` with a (symbolic) rank gives what one rank runs."""
