"""LLaMA-60m, bf16 GEMMs, adamw: C4 en, T5 tokenizer, 1.1B tokens (NUMERICS.md §10).

    python train.py --config=configs/llama_60m_bf16.py --workdir=runs/llama_60m_bf16 \
        --config.data.tokenizer=/path/to/t5/spiece.model

Needs c4/en prepared as array_record (`tfds build c4/en --file_format=array_record`) and T5's
SentencePiece model (vocab 32000); see NUMERICS.md §10 for the paper settings.
"""

from lpjax.train.config import paper_config


def get_config():
  c = paper_config("60m", recipe="bf16", optimizer="adamw")
  return c
