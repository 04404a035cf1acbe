"""A config's LLaMA train step, AOT-compiled from ShapeDtypeStructs on a mesh (nothing allocated).

Shared by `llama_memory.py` (XLA's memory analysis) and `weight_gather.py` (the collectives in the
compiled HLO). The step is traced as the trainer traces it: activation sharding hints on, and
quantized weights gathered as codes under FSDP when `config.quant.gather_quantized_weights`.
jax is imported on the first compile, after the script sets up its virtual CPU devices
(`cpu_devices.use_virtual_cpu_devices`).
"""

from __future__ import annotations

import functools
import time


def add_step_arguments(parser):
  """The flags that pick the step: --config, --devices, --vocab, --batch_size (no jax import,
  so a script can parse them before it sets up its virtual devices)."""
  parser.add_argument("--config", required=True, help="a config file in configs/")
  parser.add_argument("--devices", type=int, default=8, help="virtual CPU devices (the mesh size)")
  parser.add_argument("--vocab", type=int, default=32000, help="vocabulary (T5: 32000)")
  parser.add_argument("--batch_size", type=int, default=0, help="override the config's global batch")


def load_config(path: str):
  """The ConfigDict of a config file (its get_config())."""
  from lpjax.train.config import load_config_file  # light: no jax import
  return load_config_file(path)


def compile_train_step(config, vocab: int, devices, *, with_state: bool = False):
  """(jax.stages.Compiled train step of `config` on `devices`, compile seconds), and with
  `with_state` the train state's ShapeDtypeStructs (with their shardings) as a third item."""
  import jax
  import jax.numpy as jnp

  from lpjax.models import llama
  from lpjax.train import config as cfg_lib
  from lpjax.train.step import _sharding as shd
  from lpjax.train.step._precision import build_policy
  from lpjax.train.step._optimizers import make_optimizer
  from lpjax.train.step._step import init_state, make_train_step
  from lpjax.train.tasks.lm import llama_config_of, lm_loss

  with config.unlocked():
    config.data.tokenizer = "byte"  # the benchmark needs no tokenizer file
    config.model.vocab_size = vocab
  config = cfg_lib.validate(config, len(devices))
  mesh = shd.make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor, devices)
  model_cfg = llama_config_of(config, vocab)
  policy = build_policy(config)  # config.quant.*: the run's recipes, kept layers, residuals
  graphdef, _ = llama.abstract_model(model_cfg, policy)
  tx = make_optimizer(config, stacked_layers=functools.partial(
      llama.stacked_layers, model_cfg, policy=policy))

  def init(key):
    return init_state(llama.init_params(model_cfg, key, policy), None, tx,
                      loss_scale=config.quant.loss_scale)

  abstract = jax.eval_shape(init, jax.random.key(0))
  shardings = shd.tree_shardings(abstract, mesh, llama.PARTITION_RULES)
  state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                       abstract, shardings)
  tokens = jax.ShapeDtypeStruct((config.batch_size, config.seq_len), jnp.int32,
                                sharding=shd.batch_sharding(mesh))
  batch = {"inputs": tokens, "targets": tokens}

  def loss_fn(params, model_state, batch, key, step_policy):  # the trainer's LM task's loss
    loss = lm_loss(graphdef, model_cfg, config.model.vocab_chunks, params, batch, step_policy, key)
    return loss, (model_state, {})

  step = make_train_step(loss_fn, tx, grad_accum_steps=config.grad_accum_steps,
                         param_rounding=config.optimizer.param_rounding,
                         grad_accum_dtype=config.grad_accum_dtype)
  gather = config.quant.gather_quantized_weights

  def traced_step(s, b, k):
    with shd.step_hints(mesh, gather_quantized_weights=gather):
      return step(s, b, k, None)

  start = time.time()
  compiled = jax.jit(traced_step, donate_argnums=(0,)).lower(
      state, batch, jax.random.key(0)).compile()
  secs = time.time() - start
  return (compiled, secs, state) if with_state else (compiled, secs)
