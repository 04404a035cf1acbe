"""lpjax.data: text and image datasets as pure functions of (seed, step), offline defaults.

Examples:
  >>> from lpjax import data
  >>> tok = data.ByteTokenizer()
  >>> tok.vocab_size
  257
"""

from lpjax.data._images import ImageDataset, digits_dataset, make_image_dataset
from lpjax.data._pipeline import SOURCES, batch_iterator, make_dataset, step_iterator
from lpjax.data._png import image_grid, save_png
from lpjax.data._text_files import embedded_dataset, stdlib_source_files, text_dataset
from lpjax.data._token_stream import TokenStreamDataset
from lpjax.data._tokenizers import ByteTokenizer, SentencePieceTokenizer, get_tokenizer

__all__ = ["SOURCES", "ByteTokenizer", "ImageDataset", "SentencePieceTokenizer",
           "TokenStreamDataset", "batch_iterator", "digits_dataset", "embedded_dataset",
           "get_tokenizer", "image_grid", "make_dataset", "make_image_dataset", "save_png",
           "step_iterator", "stdlib_source_files", "text_dataset"]
