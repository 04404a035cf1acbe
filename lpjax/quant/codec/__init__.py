"""lpjax.quant.codec: arrays to codes and scales and back. Stands on `numerics` and `formats`.

Modules, and what they offer to the rest of lpjax:
- `qarray`: `QArray` and `quantize` / `dequantize` / `fake_quant` / `random_bits` (the public
  functions), with the `impl=` dispatch to a registered kernel backend (`lpjax.quant.backends`).
- `unpacked`: `quantize_unpacked` gives an encode's codes (unpacked), scales and values at once
  (`Unpacked`).
- `group_codec`: `encode` / `decode` of a grouped array, exact or on the fast path.
- `scales_exact`: block scales in exact integer arithmetic (`e8m0_exponent`, NVFP4's two-level
  scales; docs/numerics.md §4-5); lpjax.pallas computes its scales with these.
- `scales_fast`: the same scales, same bits, in float32.
- `fast_elements`: the per-element routines of the fast path (float32, bit-identical to the
  integer ones) and `reference_arithmetic`.
- `factor_tables`: the fast path's per-group factors for each scale byte, gathered per group.
"""
