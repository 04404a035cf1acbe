"""LLaMA-130m, nvfp4 GEMMs, stable_spam: C4 en, T5 tokenizer, 2.2B tokens (the 4-bit runs of NUMERICS.md §10).

    python train.py --config=configs/llama_130m_nvfp4.py --workdir=runs/llama_130m_nvfp4 \
        --config.data.tokenizer=/path/to/t5/spiece.model

Needs c4/en prepared as array_record (`tfds build c4/en --file_format=array_record`) and T5's
SentencePiece model (vocab 32000); see NUMERICS.md §10 for the paper settings.
"""

from lpjax.train.config import paper_config


def get_config():
  c = paper_config("130m", recipe="nvfp4", optimizer="stable_spam")
  return c
