"""LLaMA-tiny, mxfp4 GEMMs, stable_spam: CPU, a few minutes, on the offline Python-stdlib corpus
(byte tokens).

    python train.py --config=configs/llama_tiny_mxfp4.py --workdir=runs/llama_tiny_mxfp4
"""

from lpjax.train.config import base_config


def get_config():
  # Every lm key at its default; the optimizer section holds Stable-SPAM's paper b1, b2, eps,
  # gamma1-3 and reset interval (lpjax.train.config.optimizer_defaults("stable_spam")).
  c = base_config("lm", optimizer="stable_spam")

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
  # Stable-SPAM as its reference training script runs it (docs/results.md, "Stable-SPAM vs Adam
  # in FP4"): b1 and gamma1 follow a cosine to eta_min over the run, and no global-norm clipping
  # (AdaClip and AdaGN bound each tensor's update).
  c.optimizer.total_steps = -1  # stable_spam total_T: the run's steps
  c.optimizer.grad_clip = 0.0  # global-norm clipping off
  c.optimizer.state_dtype = "float32"  # optimizer moments

  c.quant.recipe = "mxfp4"  # MXFP4 GEMMs (E8M0 scales of 32; stochastic rounding in backward)

  c.eval_every = 100  # steps
  c.eval_steps = 8  # batches per evaluation
  c.checkpoint_every = 100  # steps
  return c
