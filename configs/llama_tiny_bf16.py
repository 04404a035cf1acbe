"""LLaMA-tiny, bf16 GEMMs, adamw: CPU, a few minutes, on the offline Python-stdlib corpus
(byte tokens).

    python train.py --config=configs/llama_tiny_bf16.py --workdir=runs/llama_tiny_bf16
"""

from lpjax.train.config import base_config


def get_config():
  # Every lm key at its default; the optimizer section holds AdamW's paper b1, b2, eps and weight
  # decay (lpjax.train.config.optimizer_defaults("adamw")).
  c = base_config("lm", optimizer="adamw")

  c.model.size = "tiny"
  c.model.compute_dtype = "float32"  # activations; weights in float32

  c.data.source = "embedded"  # this Python's standard-library sources, offline
  c.data.tokenizer = "byte"

  c.steps = 300
  c.batch_size = 16  # sequences
  c.seq_len = 128  # tokens per sequence

  c.optimizer.lr = 3e-3  # peak learning rate
  c.optimizer.warmup_steps = 30  # linear warm-up from 0
  c.optimizer.min_lr_ratio = 0.1  # then cosine decay to 10% of lr
  c.optimizer.state_dtype = "float32"  # optimizer moments

  c.quant.recipe = "bf16"  # bf16 GEMMs: the baseline

  c.eval_every = 100  # steps
  c.eval_steps = 8  # batches per evaluation
  c.checkpoint_every = 100  # steps
  return c
