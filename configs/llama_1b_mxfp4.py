"""LLaMA-1b, mxfp4 GEMMs, stable_spam: C4 en, T5 tokenizer, 2.2B tokens, 8 GPUs (the 4-bit runs
of docs/numerics.md §10).

    python train.py --config=configs/llama_1b_mxfp4.py --workdir=runs/llama_1b_mxfp4 \
        --config.data.tokenizer=/path/to/t5/spiece.model

Needs c4/en prepared as array_record (`tfds build c4/en --file_format=array_record`), or in TFDS's
default tfrecord format with TensorFlow installed (`pip install -e '.[tf]'`; read through tf.data),
and T5's SentencePiece model (vocab 32000); see docs/numerics.md §10 for the paper settings.

Per-device memory, XLA's estimate (benchmarks/memory/llama_memory.py --licm=off, docs/results.md
"Memory"): 2.51 GiB with remat, 0.593x of the same run with FP32 Adam and no quantization; with
--config.model.remat=False 6.28 GiB (FP4-packed GEMM residuals; 0.487x), which also fits a
40 GB A100 and skips the recomputation. The bf16 master weights, bf16 gradient accumulators and
vocabulary slices below are memory options; their quality on the tiny model is in
docs/results.md.
"""

from lpjax.train.config import base_config


def get_config():
  # Every lm key at its default; the optimizer section holds Stable-SPAM's paper b1, b2, eps,
  # gamma1-3 and reset interval (lpjax.train.config.optimizer_defaults("stable_spam")).
  c = base_config("lm", optimizer="stable_spam")

  c.model.size = "1b"
  c.model.compute_dtype = "bfloat16"  # activations
  c.model.remat = True  # recompute each block in the backward pass (memory)
  c.model.param_dtype = "bfloat16"  # master weights in bf16, updated with stochastic rounding

  c.data.source = "tfds"
  c.data.tfds_name = "c4/en"
  c.data.tokenizer = "spiece.model"  # T5's SentencePiece model: pass its real path

  c.steps = 20_000
  c.batch_size = 512  # sequences
  c.seq_len = 256  # tokens per sequence
  c.grad_accum_steps = 8  # 8 microbatches of 64 sequences: 8 per GPU at a time
  c.grad_accum_dtype = "bfloat16"  # their gradients summed in bf16 (stochastic rounding)

  c.optimizer.lr = 2e-4  # peak learning rate
  c.optimizer.warmup_steps = 2000  # linear warm-up from 0
  c.optimizer.min_lr_ratio = 0.1  # then cosine decay to 10% of lr
  # Stable-SPAM as its reference training script runs it (docs/results.md, "Stable-SPAM vs Adam
  # in FP4"): b1 and gamma1 follow a cosine to eta_min over the run, and no global-norm clipping
  # (AdaClip and AdaGN bound each tensor's update).
  c.optimizer.total_steps = -1  # stable_spam total_T: the run's steps
  c.optimizer.grad_clip = 0.0  # global-norm clipping off
  c.optimizer.state_dtype = "bfloat16"  # bf16 moments with stochastic rounding (memory)

  c.model.vocab_chunks = 8  # LM head + loss over 8 vocabulary slices: no whole float32 logits

  c.quant.recipe = "mxfp4"  # MXFP4 GEMMs (E8M0 scales of 32; stochastic rounding in backward)
  c.quant.residuals = "quantized"  # FP4-packed column-wise copies saved for the backward pass

  c.eval_every = 1000  # steps
  c.eval_steps = 20  # batches per evaluation
  c.checkpoint_every = 1000  # steps

  c.mesh.fsdp = 8  # parameters, gradients and optimizer state sharded over 8 GPUs
  c.mesh.data = 1
  return c
