"""LLaMA-tiny, mxfp4 GEMMs, stable_spam: CPU, a few minutes, on the offline Python-stdlib corpus (byte tokens).

    python train.py --config=configs/llama_tiny_mxfp4.py --workdir=runs/llama_tiny_mxfp4
"""

from lpjax.train.config import paper_config


def get_config():
  c = paper_config("tiny", recipe="mxfp4", optimizer="stable_spam")
  return c
