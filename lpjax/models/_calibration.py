"""Activation calibration for ModelOpt's NVFP4 (weights and activations) export
(`python -m lpjax.export --format=nvfp4 --calibration_batches=N`).

ModelOpt's "NVFP4" algorithm quantizes each linear layer's input at serving time with a static
per-tensor scale, `<name>.input_scale` (float32 scalar) = amax / (6 * 448): the largest |input| the
layer saw while calibrating, over E2M1's largest value times E4M3's. vLLM's ModelOpt loader
(vllm/model_executor/layers/quantization/modelopt.py, `ModelOptNvFp4Config` /
`ModelOptNvFp4LinearMethod`) reads it beside `weight`, `weight_scale` and the scalar
`weight_scale_2` when hf_quant_config.json says quant_algo "NVFP4": its
`process_weights_after_loading` quantizes the input with the global scale 1 / input_scale and
multiplies the GEMM by alpha = input_scale * weight_scale_2 (the same amax / 2688 convention as
weight_scale_2; W4A16_NVFP4 has no `input_scale`).
ModelOpt calibrates with the quantizers off (`max_calibrate`: the model's high-precision
forward), and so does lpjax: the run's master weights, every GEMM in float32.

`input_amax` runs lpjax's LLaMA (its blocks unrolled) over the batches and records each linear
layer's input |max| with a host callback; `input_scales` turns them into ModelOpt's tensors
(the run's batches: lpjax/export.py, run_batches).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

E2M1_MAX, E4M3_MAX = 6.0, 448.0


def input_amax(cfg, params, batches) -> dict[str, float]:
  """{lpjax layer path, e.g. "layers/0/attn/q_proj": max |input| over `batches`} of lpjax's
  LLaMA `params` of `cfg` (scanned or not), each batch (B, L) int32 tokens, every GEMM in
  float32 (the quantizers off, as ModelOpt calibrates)."""
  from lpjax import quant  # noqa: PLC0415
  from lpjax.models import hf_llama, llama  # noqa: PLC0415
  from lpjax.nn import QDense  # noqa: PLC0415

  unrolled = dataclasses.replace(cfg, scan_layers=False, remat=False, compute_dtype="float32")
  policy = quant.QuantPolicy(recipe="fp32", high_precision="fp32")
  graphdef, abstract = llama.abstract_model(unrolled, policy)
  flat = hf_llama._flat_params(params)
  own = jax.tree_util.tree_map_with_path(
      lambda path, _: jnp.asarray(flat[hf_llama._lpjax_path(path)], jnp.float32), abstract)
  amax: dict[str, float] = {}

  def record(path, value):
    amax[path] = max(amax.get(path, 0.0), float(value))

  call = QDense.__call__

  def observed(self, x, **kw):
    jax.debug.callback(lambda v, p=self.path: record(p, v), jnp.max(jnp.abs(x)), ordered=False)
    return call(self, x, **kw)

  def forward(p, tokens):
    return llama.apply(graphdef, unrolled, p, tokens, None, jax.random.key(0))

  QDense.__call__ = observed  # the trace sees it; the compiled program keeps the callbacks
  try:
    compiled = jax.jit(forward)
    for tokens in batches:
      jax.block_until_ready(compiled(own, jnp.asarray(tokens, jnp.int32)))
    jax.effects_barrier()
  finally:
    QDense.__call__ = call
  return amax


def input_scales(amax: dict[str, float]) -> dict[str, np.ndarray]:
  """{lpjax layer path: float32 scalar input_scale = amax / (6 * 448)} (ModelOpt's convention).

  Examples:
    >>> input_scales({"layers/0/mlp/up_proj": 2688.0})["layers/0/mlp/up_proj"]
    array(1., dtype=float32)
  """
  return {path: np.asarray(np.float32(a) / np.float32(E2M1_MAX * E4M3_MAX), np.float32)
          for path, a in amax.items()}

