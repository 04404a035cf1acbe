"""LLaMA-350m, mxfp4 GEMMs, stable_spam: C4 en, T5 tokenizer, 2.2B tokens (the 4-bit runs of
docs/numerics.md §10).

    python train.py --config=configs/llama_350m_mxfp4.py --workdir=runs/llama_350m_mxfp4 \
        --config.data.tokenizer=/path/to/t5/spiece.model

Needs c4/en prepared as array_record (`tfds build c4/en --file_format=array_record`) and T5's
SentencePiece model (vocab 32000); see docs/numerics.md §10 for the paper settings.
"""

from lpjax.train.config import base_config


def get_config():
  # Every lm key at its default; the optimizer section holds Stable-SPAM's paper b1, b2, eps,
  # gamma1-3 and reset interval (lpjax.train.config.optimizer_defaults("stable_spam")).
  c = base_config("lm", optimizer="stable_spam")

  c.model.size = "350m"
  c.model.compute_dtype = "bfloat16"  # activations; weights in float32

  c.data.source = "tfds"
  c.data.tfds_name = "c4/en"
  c.data.tokenizer = "spiece.model"  # T5's SentencePiece model: pass its real path

  c.steps = 20_000
  c.batch_size = 512  # sequences
  c.seq_len = 256  # tokens per sequence

  c.optimizer.lr = 4e-4  # peak learning rate
  c.optimizer.warmup_steps = 2000  # linear warm-up from 0
  c.optimizer.min_lr_ratio = 0.1  # then cosine decay to 10% of lr
  # Stable-SPAM as its reference training script runs it (docs/results.md, "Stable-SPAM vs Adam
  # in FP4"): b1 and gamma1 follow a cosine to eta_min over the run, and no global-norm clipping
  # (AdaClip and AdaGN bound each tensor's update).
  c.optimizer.total_steps = -1  # stable_spam total_T: the run's steps
  c.optimizer.grad_clip = 0.0  # global-norm clipping off
  c.optimizer.state_dtype = "bfloat16"  # bf16 moments with stochastic rounding (memory)

  c.quant.recipe = "mxfp4"  # MXFP4 GEMMs (E8M0 scales of 32; stochastic rounding in backward)

  c.eval_every = 1000  # steps
  c.eval_steps = 20  # batches per evaluation
  c.checkpoint_every = 1000  # steps
  return c
