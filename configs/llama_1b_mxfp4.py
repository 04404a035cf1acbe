"""LLaMA-1b, mxfp4 GEMMs, stable_spam: C4 en, T5 tokenizer, 2.2B tokens, 8 GPUs (the 4-bit runs of NUMERICS.md §10).

    python train.py --config=configs/llama_1b_mxfp4.py --workdir=runs/llama_1b_mxfp4 \
        --config.data.tokenizer=/path/to/t5/spiece.model

Needs c4/en prepared as array_record (`tfds build c4/en --file_format=array_record`), or in TFDS's
default tfrecord format with TensorFlow installed (`pip install -e '.[tf]'`; read through tf.data),
and T5's SentencePiece model (vocab 32000); see NUMERICS.md §10 for the paper settings.

Per-device memory, XLA's estimate (benchmarks/llama_memory.py, docs/results.md "Memory"): 3.9 GiB
with remat; with --config.model.remat=False about 7.5 GiB (FP4-packed GEMM residuals), which
also fits a 40 GB A100 and skips the recomputation.
"""

from lpjax.train.config import paper_config


def get_config():
  c = paper_config("1b", recipe="mxfp4", optimizer="stable_spam")
  c.optimizer.state_dtype = "bfloat16"  # bf16 moments with stochastic rounding (memory)
  c.mesh.fsdp = 8  # parameters, gradients and optimizer state sharded over 8 GPUs
  c.mesh.data = 1
  c.model.remat = True
  c.grad_accum_steps = 8  # 8 microbatches of 64 sequences: 8 per GPU at a time
  c.quant.residuals = "quantized"  # FP4-packed column-wise copies saved for the backward pass
  return c
