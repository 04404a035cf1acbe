"""lpjax.data: text and image datasets as pure functions of (seed, step), offline defaults.

Examples:
  >>> from lpjax import data
  >>> tok = data.ByteTokenizer()
  >>> tok.vocab_size
  257
"""

from lpjax.data.images import ImageDataset, make_image_dataset
from lpjax.data.pipeline import SOURCES, batch_iterator, make_dataset
from lpjax.data.png import image_grid, save_png
from lpjax.data.text_files import embedded_dataset, stdlib_source_files, text_dataset
from lpjax.data.token_stream import TokenStreamDataset
from lpjax.data.tokenizers import ByteTokenizer, SentencePieceTokenizer, get_tokenizer

__all__ = ["SOURCES", "ByteTokenizer", "ImageDataset", "SentencePieceTokenizer",
           "TokenStreamDataset", "batch_iterator", "embedded_dataset", "get_tokenizer",
           "image_grid", "make_dataset", "make_image_dataset", "save_png", "stdlib_source_files",
           "text_dataset"]
