"""Optimizer-state memory of Stable-SPAM (fp32 vs bf16 moments) for the LLaMA-60M shapes.

Builds the parameter shapes of the paper's LLaMA-60M (docs/numerics.md §10: hidden 512, intermediate
1376, 8 heads, 8 layers, vocab 32000, untied embedding and LM head, RMSNorm weights) as
``jax.ShapeDtypeStruct`` and measures the state of each optimizer with ``jax.eval_shape`` on
its ``init`` (nothing is allocated). optax.adam with fp32 state is the baseline.

    .venv/bin/python benchmarks/memory/optim_state_memory.py

Prints a table and, last, one JSON line with the numbers.
"""

import json
import os
import sys

import jax
import jax.numpy as jnp
import optax

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from lpjax import optim  # noqa: E402  (after the path set-up, for a run from a clone)

LLAMA_60M = dict(hidden=512, intermediate=1376, heads=8, layers=8, vocab=32000)


def llama_param_shapes(hidden, intermediate, heads, layers, vocab, dtype=jnp.float32):
  """The parameter pytree of a LLaMA model as ShapeDtypeStructs."""
  del heads  # the attention projections are hidden x hidden whatever the head count
  spec = lambda *shape: jax.ShapeDtypeStruct(shape, dtype)
  layer = {
      "attn_norm": spec(hidden),
      "q": spec(hidden, hidden), "k": spec(hidden, hidden),
      "v": spec(hidden, hidden), "o": spec(hidden, hidden),
      "mlp_norm": spec(hidden),
      "gate": spec(hidden, intermediate), "up": spec(hidden, intermediate),
      "down": spec(intermediate, hidden),
  }
  return {
      "embed": spec(vocab, hidden),
      "layers": [dict(layer) for _ in range(layers)],
      "final_norm": spec(hidden),
      "lm_head": spec(hidden, vocab),
  }


def tree_bytes(tree):
  return sum(x.size * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def main():
  params = llama_param_shapes(**LLAMA_60M)
  num_params = sum(x.size for x in jax.tree.leaves(params))
  optimizers = {
      "adam fp32 (baseline)": optax.adam(1e-3),
      "stable_spam fp32 state": optim.stable_spam(1e-3),
      "stable_spam bf16 mu/nu": optim.stable_spam(
          1e-3, mu_dtype=jnp.bfloat16, nu_dtype=jnp.bfloat16),
      "spam fp32 state": optim.spam(1e-3),
  }
  rows = {}
  for name, tx in optimizers.items():
    state = jax.eval_shape(tx.init, params)
    rows[name] = tree_bytes(state)
  baseline = rows["adam fp32 (baseline)"]
  print(f"LLaMA-60M: {num_params:,} parameters, {tree_bytes(params) / 2**20:.1f} MiB in fp32")
  print(f"{'optimizer':<26} {'state bytes':>14} {'MiB':>9} {'bytes/param':>12} {'vs adam':>8}")
  for name, nbytes in rows.items():
    print(f"{name:<26} {nbytes:>14,} {nbytes / 2**20:>9.2f} {nbytes / num_params:>12.4f} "
          f"{nbytes / baseline:>8.3f}")
  print(json.dumps({
      "model": "llama_60m", "num_params": num_params,
      "param_bytes_fp32": tree_bytes(params),
      "state_bytes": rows,
      "bf16_over_fp32_stable_spam": rows["stable_spam bf16 mu/nu"] /
                                    rows["stable_spam fp32 state"],
  }))


if __name__ == "__main__":
  main()
