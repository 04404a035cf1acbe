"""lpjax.quant.intercept: any model's GEMMs through the policy, no rewrite. The top of lpjax.quant.

Stands on `gemm`, `recipes` and `policy`; knows no Flax (the Flax adapters of `quantize_model`
register in `lpjax.quant.backends.MODEL_ADAPTERS`). Modules, and what they offer:
- `entry_points`: `quantized`, `quantize_model`, `report`, `collect_sites`, `stacked_weights`
  (the public functions), and for the model adapters of lpjax.nn: `as_policy` (a recipe name or
  policy -> QuantPolicy) and `run` (one call of a function with its GEMMs intercepted).
- `evaluator`: the jaxpr evaluator that routes each GEMM equation through the policy.
- `equations`: what the evaluator asks of one equation (a GEMM? its contraction length? an
  embedding table or a weight computed from parameters?), and how to bind it as written.
- `sites`: `Site` and `Report`, what a trace found.
- `roles`: what a product of two activations is (attention's score / value product, or an
  "act_product"), from the data flow.
- `rule_check`: the rules that match no site, and the nearest site paths.
- `gemm_call`: the quantized call that replaces one GEMM equation.
- `jax_compat`: everything the others read of JAX's jaxprs (primitive parameters that change
  between JAX releases), in one place.
"""
