"""lpjax.data: text datasets as pure functions of (seed, step), and the offline default corpus.

Examples:
  >>> from lpjax import data
  >>> tok = data.ByteTokenizer()
  >>> tok.vocab_size
  257
"""

from lpjax.data.pipeline import SOURCES, batch_iterator, make_dataset
from lpjax.data.text_files import embedded_dataset, stdlib_source_files, text_dataset
from lpjax.data.token_stream import TokenStreamDataset
from lpjax.data.tokenizers import ByteTokenizer, SentencePieceTokenizer, get_tokenizer

__all__ = ["SOURCES", "ByteTokenizer", "SentencePieceTokenizer", "TokenStreamDataset",
           "batch_iterator", "embedded_dataset", "get_tokenizer", "make_dataset",
           "stdlib_source_files", "text_dataset"]
