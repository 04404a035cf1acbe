"""lpjax.data: tokenizers, the offline corpus, local text, TFDS (mocked), batch purity."""

import os

import numpy as np
import pytest

from lpjax import data
from lpjax.data import _cache as cache
from lpjax.data._token_stream import TokenStreamDataset


def test_byte_tokenizer_round_trip():
  tok = data.ByteTokenizer()
  text = "naïve ∑ text\n"
  ids = tok.encode(text)
  assert ids.max() < 256 and tok.decode(ids) == text
  assert list(tok.encode("A")) == [65]


def test_sentencepiece_tokenizer_trained_offline(tmp_path):
  spm = pytest.importorskip("sentencepiece")
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("\n".join(f"the quick brown fox {i} jumps over the lazy dog" for i in range(300)))
  spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(tmp_path / "sp"),
                                 vocab_size=60, model_type="bpe", minloglevel=2)
  tok = data.get_tokenizer(str(tmp_path / "sp.model"))
  assert tok.vocab_size == 60
  assert tok.decode(tok.encode("the lazy dog")) == "the lazy dog"
  ds = data.text_dataset(str(corpus), str(tmp_path / "sp.model"), cache_root=str(tmp_path / "c"))
  assert ds.vocab_size == 60 and int(np.max(ds.train_tokens)) < 60


def test_missing_tokenizer_file_names_the_fix(tmp_path):
  with pytest.raises(FileNotFoundError, match="SentencePiece model file .* does not exist"):
    data.get_tokenizer(str(tmp_path / "nope.model"))


def test_embedded_corpus_is_the_stdlib_without_tests(tmp_path):
  files = data.stdlib_source_files()
  assert len(files) > 300
  assert not any(f"{os.sep}test{os.sep}" in f for f in files)
  ds = data.embedded_dataset(cache_root=str(tmp_path))
  total = len(ds.train_tokens) + len(ds.eval_tokens)
  assert total > 5_000_000  # megabytes of real text
  assert 0.005 < len(ds.eval_tokens) / total < 0.1
  sample = (np.asarray(ds.train_tokens[:5000]) % 256).astype(np.uint8).tobytes()
  assert b"def " in sample or b"import " in sample or b'"""' in sample
  # Prepared once: a second call reads the same cache.
  again = data.embedded_dataset(cache_root=str(tmp_path))
  assert np.array_equal(np.asarray(again.eval_tokens[:100]), np.asarray(ds.eval_tokens[:100]))


def test_batches_are_a_pure_function_of_seed_and_step():
  ds = TokenStreamDataset(np.arange(100_000) % 251, np.arange(5_000) % 251, vocab_size=251)
  a = ds.train_batch(7, 8, 32, seed=3)
  b = ds.train_batch(7, 8, 32, seed=3)
  c = ds.train_batch(8, 8, 32, seed=3)
  d = ds.train_batch(7, 8, 32, seed=4)
  assert np.array_equal(a["inputs"], b["inputs"])
  assert not np.array_equal(a["inputs"], c["inputs"])
  assert not np.array_equal(a["inputs"], d["inputs"])
  assert np.array_equal(a["inputs"][:, 1:], a["targets"][:, :-1])
  # Each process computes exactly its own rows of the global batch.
  halves = [ds.train_batch(7, 8, 32, seed=3, process_index=p, process_count=2) for p in (0, 1)]
  assert np.array_equal(np.concatenate([h["inputs"] for h in halves]), a["inputs"])
  with pytest.raises(ValueError, match="not divisible"):
    ds.train_batch(0, 6, 32, seed=0, process_count=4)


def test_iterator_resumes_with_the_same_batches():
  ds = TokenStreamDataset(np.arange(20_000) % 97, np.arange(2_000) % 97, vocab_size=97)
  it = data.batch_iterator(ds, start_step=0, batch_size=4, seq_len=16, seed=0)
  full = [next(it) for _ in range(6)]
  assert [step for step, _ in full] == list(range(6))
  resumed = data.batch_iterator(ds, start_step=3, batch_size=4, seq_len=16, seed=0)
  for expected_step, expected in full[3:]:
    step, batch = next(resumed)
    assert step == expected_step
    assert np.array_equal(batch["inputs"], expected["inputs"])


def test_eval_batches_are_consecutive_windows():
  tokens = np.arange(1000)
  ds = TokenStreamDataset(tokens, tokens, vocab_size=1000)
  b0 = ds.eval_batch(0, 2, 10)
  assert b0["inputs"][0].tolist() == list(range(10))
  assert b0["inputs"][1].tolist() == list(range(10, 20))
  assert ds.num_eval_batches(2, 10) == 49


def test_text_files_split_by_file_deterministically(tmp_path):
  for i in range(40):
    (tmp_path / f"doc{i:02d}.txt").write_text(f"document number {i}\n" * 20)
  ds1 = data.text_dataset(str(tmp_path / "*.txt"), cache_root=str(tmp_path / "cache1"))
  ds2 = data.text_dataset(str(tmp_path / "*.txt"), cache_root=str(tmp_path / "cache2"))
  assert np.array_equal(np.asarray(ds1.eval_tokens), np.asarray(ds2.eval_tokens))
  assert len(ds1.eval_tokens) > 0 and len(ds1.train_tokens) > len(ds1.eval_tokens)
  with pytest.raises(FileNotFoundError, match="No text files match"):
    data.text_dataset(str(tmp_path / "*.md"), cache_root=str(tmp_path))


@pytest.mark.parametrize("damage", [b"garbage", None])
def test_corrupt_cache_is_rebuilt_with_a_warning(tmp_path, caplog, damage):
  build = lambda: {"train": np.arange(10, dtype=np.uint16)}
  cache.cached_splits(str(tmp_path), "k", build)
  path = tmp_path / "k" / "train.npy"
  if damage is None:  # a truncated file: valid header, fewer tokens than the manifest says
    np.save(path, np.arange(4, dtype=np.uint16))
  else:
    path.write_bytes(damage)
  with caplog.at_level("WARNING", logger="lpjax.data"):
    arrays = cache.cached_splits(str(tmp_path), "k", build)
  assert arrays["train"].tolist() == list(range(10))
  assert "corrupt" in caplog.text and "rebuilding" in caplog.text


def test_tfds_c4_through_mock_data():
  tfds = pytest.importorskip("tensorflow_datasets")
  import tensorflow_datasets.text.c4  # noqa: F401  (registers the builder)

  with tfds.testing.mock_data(num_examples=16, policy=tfds.testing.MockPolicy.USE_CODE):
    ds = data.make_dataset("tfds", tfds_name="c4/en", tokenizer="byte")
    a = ds.train_batch(2, 4, 32, seed=0)
    b = ds.train_batch(2, 4, 32, seed=0)
    assert a["inputs"].shape == (4, 32) and np.array_equal(a["inputs"], b["inputs"])
    assert a["inputs"].max() <= 256
    e = ds.eval_batch(0, 4, 32)
    assert e["targets"].shape == (4, 32)


def test_unprepared_tfds_dataset_gives_the_prepare_command(tmp_path):
  pytest.importorskip("tensorflow_datasets")
  with pytest.raises(FileNotFoundError, match="tfds build c4/en --file_format=array_record"):
    data.make_dataset("tfds", tfds_name="c4/en", tfds_data_dir=str(tmp_path))


def test_bad_source_lists_valid_ones():
  with pytest.raises(ValueError, match="embedded, text, tfds"):
    data.make_dataset("hub")
