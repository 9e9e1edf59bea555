"""The numeric witness: XLA's own CPU runtime executes the baseline on one device and every rank
of the distributed program (real collectives) on random inputs that satisfy the relations file,
and compares the outputs under the relations the outputs must have.

It sits below ``engine.analysis`` and knows nothing of facts or rules: it reads HLO text and a
relations document (the YAML's plain data) and answers with numbers. Modules:

- ``runtime``: jax/jaxlib access (imported lazily, once), reading a module, the
  replica/partition flavour mapping, mesh replica groups written out explicitly (XLA's
  importer loses their meaning), channel renumbering, compiling (cached) and executing;
- ``inputs``: random inputs that satisfy the input relations (and ``int_range``); each group
  its own data where the relations say so (``per_group_data``); edge inputs on seeds >= 1000;
- ``compare``: per-dtype tolerances and the comparison of one output under its relation;
- ``segment``: cutting instructions out of a text (a diverging instruction with its operands
  as parameters) and adding extra outputs (numeric localization);
- ``model``: the recheck's texts: f32 computed in f64 with every written rounding kept, and the
  baseline's bf16/f16 sums in other orders (the scale of its own low-precision rounding);
- ``pair``: the whole witness over several seeds, with the f64 recheck of rounding noise and a
  memory budget checked before anything executes.
"""

from .pair import (
    MemoryBudgetError,
    PairReport,
    Probe,
    WitnessOptions,
    estimate_bytes,
    instruction_differs,
    run_pair,
    witness,
)

__all__ = ["MemoryBudgetError", "PairReport", "Probe", "WitnessOptions", "estimate_bytes", "instruction_differs", "run_pair", "witness"]
