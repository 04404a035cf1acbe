"""LLaMA-tiny, bf16 GEMMs, adamw: CPU, a few minutes, on the offline Python-stdlib corpus (byte tokens).

    python train.py --config=configs/llama_tiny_bf16.py --workdir=runs/llama_tiny_bf16
"""

from lpjax.train.config import paper_config


def get_config():
  c = paper_config("tiny", recipe="bf16", optimizer="adamw")
  return c
