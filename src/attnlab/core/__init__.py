"""Pure data: the problem, specs and validators, model presets, units, errors, the record schema (no JAX at import)."""
