"""lpjax.quant.gemm: quantized GEMMs, one `jax.custom_vjp` path for every way in.

Stands on `codec`, `schemes` and `recipes`. Modules, and what they offer to the rest of lpjax:
- `dot_general`: quantized `dot_general` (a recipe's fwd / dgrad / wgrad), `operand_stats`.
- `pass_operands`: the operands of its three passes (quantized, reused from the forward, or
  unpacked from residuals), in the layout and on the shards each GEMM multiplies.
- `operand_probes`: what its operand quantizers see (`quantizer_inputs`, for the monitor) and
  `operand_stats`, recomputed for measurement.
- `einsum`, `conv`: two-operand einsum and `conv_general_dilated` through `dot_general`.
- `canonical`: a dot_general's operands in canonical (B, M, K) x (B, K, N) form.
- `operand`: one operand through its recipe (`fake`, `pack`, `unpack`, operand keys);
  benchmarks time these quantizers.
- `kernel_dispatch`: which GEMMs run on the FP4 GEMM kernel of the registered backend.
- `weight_gather`: FP4 weight all-gather under FSDP (`gather_weight`, `weight_sharding`).
"""
