"""lpjax.quant.numerics: exact float32 arithmetic, the floor of lpjax.quant (imports nothing above).

Modules, and what they offer to the rest of lpjax (lpjax.pallas builds its kernels on them):
- `fp32_bits`: IEEE float32 on bit patterns with integer operations (`to_bits`, `split`,
  `mul_by_scale`, `recip`, ...), so subnormals survive on backends that flush them.
- `exact_float`: correctly rounded float32 products and reciprocals from float operations.
- `rng`: the counter hash behind stochastic rounding (`hash_bits`, `stream_words`, `random_bits`,
  `fold_in`; docs/numerics.md §6).
- `materialize`: per-group values computed once (the XLA:CPU fusion workaround).
- `threefry`: `jax.random.fold_in`'s bits without its Threefry loop (`fold_in`, `fold_in_each`:
  the GEMM sites' keys, `QuantPolicy.site_key`).
"""
