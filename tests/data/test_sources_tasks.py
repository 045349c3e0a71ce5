"""Tests of memjax.data.sources and memjax.data.tasks."""

import os
import shutil

import numpy as np
import pytest
import seqio

from memjax.data import sources
from memjax.data import tasks
from memjax.data import vocab as vocab_lib

# Three articles in WikiText-103 format, with sections. The file opens with
# a blank line, as the real ones do; lines keep their edge spaces.
ARTICLE_1 = (
    " = Alpha = \n"
    " \n"
    " the cat sat . \n"
    " \n"
    " = = History = = \n"
    " \n"
    " the dog sat on the cat . \n"
    " \n"
)
ARTICLE_2 = (
    " = Beta <unk> = \n"
    " \n"
    " = = Early life = = \n"
    " \n"
    " = = = Childhood = = = \n"
    " a dog , a cat . \n"
    " \n"
)
ARTICLE_3 = " = Gamma = \n" " \n" " the end \n"
WIKI_TEXT = " \n" + ARTICLE_1 + ARTICLE_2 + ARTICLE_3


@pytest.fixture(name="wiki_dir")
def fixture_wiki_dir(tmp_path):
  data_dir = tmp_path / "wikitext"
  data_dir.mkdir()
  for split in ("train", "valid", "test"):
    (data_dir / f"wiki.{split}.tokens").write_text(WIKI_TEXT, encoding="utf-8")
  return str(data_dir)


def test_wikitext_is_cut_at_top_level_headings():
  docs = sources.split_wikitext_articles(WIKI_TEXT)
  assert docs == [" \n" + ARTICLE_1, ARTICLE_2, ARTICLE_3]
  assert "".join(docs) == WIKI_TEXT
  assert sources.split_wikitext_articles("") == []


def test_read_documents_of_wikitext_keeps_lines_exactly(wiki_dir):
  docs = sources.read_documents("wikitext", wiki_dir, "valid")
  assert docs == [" \n" + ARTICLE_1, ARTICLE_2, ARTICLE_3]


def test_demo_wikitext_articles():
  data_dir = sources.default_data_dir("wikitext103")
  assert data_dir == os.path.join(sources.DEMO_DATA_DIR, "wikitext")
  docs = sources.read_documents("wikitext103", data_dir, "valid")
  assert len(docs) == 5
  # Blank lines before the first heading belong to the first article.
  assert docs[0].lstrip(" \n").startswith("= Achilles = \n")
  titles = [d.split("\n", 1)[0] for d in docs[1:]]
  assert titles == [
      " = Abraham Lincoln = ",
      " = Aristotle = ",
      " = An American in Paris = ",
      " = Academy Award for Best Production Design = ",
  ]
  with open(os.path.join(data_dir, "wiki.valid.tokens"), "rb") as f:
    assert "".join(docs).encode("utf-8") == f.read()


def test_byte_corpora_are_one_document_of_raw_bytes():
  for corpus, name in (("enwik8", "valid.xml"), ("text8", "valid.txt")):
    data_dir = sources.default_data_dir(corpus)
    docs = sources.read_documents(corpus, data_dir, "valid")
    with open(os.path.join(data_dir, name), "rb") as f:
      assert docs == [f.read()]


def test_single_release_file_is_split_90_5_5_by_convention(tmp_path):
  rng = np.random.default_rng(0)
  eval_bytes = sources.EVAL_SPLIT_BYTES
  data = rng.integers(0, 256, 2 * eval_bytes + 1000, dtype=np.uint8)
  data = data.tobytes()
  (tmp_path / "enwik8").write_bytes(data)
  read = lambda split: sources.read_documents("enwik8", str(tmp_path), split)
  assert read("train") == [data[:1000]]
  assert read("valid") == [data[1000 : 1000 + eval_bytes]]
  assert read("test") == [data[1000 + eval_bytes :]]
  assert sources.release_split_range(100_000_000, "train") == (0, 90_000_000)
  assert sources.release_split_range(100_000_000, "validation") == (
      90_000_000,
      95_000_000,
  )


def test_too_small_release_file_raises(tmp_path):
  (tmp_path / "text8").write_bytes(b" abc" * 100)
  with pytest.raises(sources.DataError, match="too small"):
    sources.read_documents("text8", str(tmp_path), "train")


def test_missing_directory_raises_one_clear_error(tmp_path):
  missing = str(tmp_path / "nowhere")
  with pytest.raises(sources.DataError) as info:
    sources.read_documents("wikitext103", missing, "train")
  message = str(info.value)
  assert missing in message
  assert "python -m memjax.data.prepare --corpus=wikitext103" in message
  assert "wiki.train.tokens" in message
  assert isinstance(info.value, ValueError)


def test_missing_file_raises_one_clear_error(tmp_path):
  (tmp_path / "wiki.train.tokens").write_text("a\n", encoding="utf-8")
  with pytest.raises(sources.DataError) as info:
    sources.split_path("wikitext", str(tmp_path), "test")
  assert str(tmp_path / "wiki.test.tokens") in str(info.value)
  with pytest.raises(sources.DataError) as info:
    tasks.load_token_stream("enwik8", str(tmp_path), "valid")
  assert str(tmp_path / "valid.xml") in str(info.value)
  assert str(tmp_path / "enwik8") in str(info.value)


def test_unknown_corpus_and_split_raise():
  with pytest.raises(sources.DataError, match="Unknown corpus 'wt2'"):
    sources.split_path("wt2", "/tmp", "train")
  with pytest.raises(sources.DataError, match="Unknown split 'dev'"):
    sources.split_path("wikitext103", "/tmp", "dev")
  assert sources.canonical_corpus("WikiText") == "wikitext103"


def test_task_is_registered_once_and_yields_documents(wiki_dir, tmp_path):
  cache = str(tmp_path / "cache")
  task = tasks.register_lm_task("wikitext", wiki_dir, cache)
  assert tasks.register_lm_task("wikitext103", wiki_dir, cache) is task
  assert task.name == tasks.task_name("wikitext103", wiki_dir)
  assert task.name in seqio.TaskRegistry.names()
  assert set(task.splits) == {"train", "validation", "test"}
  examples = list(
      task.get_dataset(
          sequence_length=None, split="validation", shuffle=False
      ).as_numpy_iterator()
  )
  vocab = task.output_features["targets"].vocabulary
  decoded = [vocab.decode(ex["targets"]) for ex in examples]
  expected = [
      "".join(" ".join(line.split()) + "\n" for line in doc.splitlines())
      for doc in (" \n" + ARTICLE_1, ARTICLE_2, ARTICLE_3)
  ]
  assert decoded == expected


def test_token_stream_of_a_tiny_data_dir(wiki_dir, tmp_path, capsys):
  cache = str(tmp_path / "cache")
  stream = tasks.load_token_stream("wikitext103", wiki_dir, "test", cache)
  vocab = vocab_lib.get_vocabulary("wikitext103", wiki_dir, cache)
  # Independent expectation: look up each word of each line, then EOS.
  expected, starts = [], []
  for line in WIKI_TEXT.split("\n")[:-1]:
    if line.startswith(" = ") and not line.startswith(" = = "):
      starts.append(len(expected))
    expected += [vocab.token_to_id(w) for w in line.split()] + [1]
  starts[0] = 0  # The opening blank line belongs to the first article.
  assert stream.tokens.dtype == np.int32
  assert stream.doc_starts.dtype == np.int64
  np.testing.assert_array_equal(stream.tokens, expected)
  np.testing.assert_array_equal(stream.doc_starts, starts)
  assert stream.vocab_size == vocab.vocab_size
  assert stream.tokens.max() < stream.vocab_size
  # The most frequent words get the lowest ids.
  counts = vocab.token_counts()[3:]
  assert np.all(np.diff(counts) <= 0)
  assert "tokenizing" in capsys.readouterr().out
  again = tasks.load_token_stream("wikitext", wiki_dir, "test", cache)
  assert capsys.readouterr().out == ""
  np.testing.assert_array_equal(again.tokens, stream.tokens)
  np.testing.assert_array_equal(again.doc_starts, stream.doc_starts)


def test_token_stream_of_a_copy_and_without_its_file(wiki_dir, tmp_path):
  cache = str(tmp_path / "cache")
  stream = tasks.load_token_stream("wikitext103", wiki_dir, "test", cache)
  copy = tmp_path / "copy"
  shutil.copytree(wiki_dir, copy, copy_function=shutil.copyfile)
  for f in copy.iterdir():
    os.utime(f, (1_000_000_000, 1_000_000_000))
  path = tasks.token_stream_path("wikitext103", wiki_dir, "test", cache)
  valid = [
      tasks.token_stream_path("wikitext103", d, "valid", cache)
      for d in (wiki_dir, str(copy))
  ]
  assert valid[0] == valid[1]  # The same bytes: the same key.
  os.remove(copy / "wiki.test.tokens")
  files = sorted(os.listdir(os.path.join(cache, "content")))
  assert tasks.is_cached("wikitext103", str(copy), "test", cache)
  assert sorted(os.listdir(os.path.join(cache, "content"))) == files
  assert tasks.token_stream_path("wikitext103", str(copy), "test", cache) == (
      path
  )  # As recorded.
  again = tasks.load_token_stream("wikitext103", str(copy), "test", cache)
  np.testing.assert_array_equal(again.tokens, stream.tokens)
  # A changed training file (present, so it decides) makes another
  # vocabulary: the recorded stream of the old one is not read.
  with open(copy / "wiki.train.tokens", "a", encoding="utf-8") as f:
    f.write(" new words here \n")
  assert not tasks.is_cached("wikitext103", str(copy), "test", cache)
  with pytest.raises(sources.DataError, match="wiki.test.tokens"):
    tasks.load_token_stream("wikitext103", str(copy), "test", cache)


def test_demo_wikitext_stream_decodes_to_the_file(tmp_path):
  data_dir = sources.default_data_dir("wikitext")
  cache = str(tmp_path)
  stream = tasks.load_token_stream("wikitext", data_dir, "valid", cache)
  vocab = vocab_lib.get_vocabulary("wikitext", data_dir, cache)
  known = set(vocab.tokens)
  path = os.path.join(data_dir, "wiki.valid.tokens")
  with open(path, encoding="utf-8") as f:
    lines = f.read().split("\n")[:-1]
  expected = "".join(
      " ".join(w if w in known else "<unk>" for w in line.split()) + "\n"
      for line in lines
  )
  assert vocab.decode(stream.tokens) == expected
  assert np.sum(stream.tokens == vocab.eos_id) == len(lines)
  assert len(stream.doc_starts) == 5


@pytest.mark.parametrize("corpus", ["enwik8", "text8"])
def test_demo_byte_streams_round_trip(corpus, tmp_path):
  data_dir = sources.default_data_dir(corpus)
  stream = tasks.load_token_stream(corpus, data_dir, "valid", str(tmp_path))
  assert stream.vocab_size == 259
  np.testing.assert_array_equal(stream.doc_starts, [0])
  path = sources.split_path(corpus, data_dir, "valid")
  with open(path, "rb") as f:
    assert vocab_lib.decode_bytes(stream.tokens) == f.read()


def test_byte_stream_keeps_invalid_utf8(tmp_path):
  data_dir = tmp_path / "enwik8"
  data_dir.mkdir()
  raw = "ünïcödé <page>".encode("utf-8")[:-3] + b"\xff\xfe\x00\x80"
  for split in ("train", "valid", "test"):
    (data_dir / f"{split}.xml").write_bytes(raw[1:])  # Cut inside 'ü'.
  stream = tasks.load_token_stream(
      "enwik8", str(data_dir), "test", str(tmp_path / "cache")
  )
  expected = np.frombuffer(raw[1:], np.uint8).astype(np.int32) + 3
  np.testing.assert_array_equal(stream.tokens, expected)
