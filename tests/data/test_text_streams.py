"""Raw-text corpora through an imported tokenizer (memjax.data.text_streams)."""

import os
import shutil

import numpy as np
import pytest

from memjax import errors
from memjax import settings
from memjax.data import corpus as corpus_lib
from memjax.data import sources
from memjax.data import text_streams
from memjax.data import tokenizer_vocab
from tests.conftest import REPO

FIXTURE = os.path.join(REPO, "tests", "fixtures", "pretrained", "gpt2")


def _tokenizer():
  with open(os.path.join(FIXTURE, "tokenizer.json"), encoding="utf-8") as f:
    return tokenizer_vocab.TokenizerVocabulary(f.read(), 64, 1, 2)


def _text_dir(root):
  texts = {
      "train": "the cat sat.\nthe dog ran.\n",
      "valid": "a cat ran.\n",
      "test": "the end\n",
  }
  root.mkdir()
  for split, text in texts.items():
    (root / f"{split}.txt").write_text(text, encoding="utf-8")
  return str(root), texts


def test_wikitext_raw_is_encoded_article_by_article(imported_gpt2, tmp_path):
  data_dir = sources.default_data_dir("wikitext_raw")
  stream = text_streams.load_stream(
      "wikitext_raw", data_dir, "valid", str(tmp_path), imported_gpt2
  )
  vocab = _tokenizer()
  with open(
      os.path.join(data_dir, "wiki.valid.raw"), encoding="utf-8", newline=""
  ) as f:
    articles = sources.split_wikitext_articles(f.read())
  assert len(articles) == 2  # The shipped demo's two validation articles.
  want = [vocab.encode(a) for a in articles]
  np.testing.assert_array_equal(stream.tokens, np.concatenate(want))
  np.testing.assert_array_equal(stream.doc_starts, [0, len(want[0])])
  assert stream.vocab_size == 64
  # Cached: read again without the corpus files, and the name says V.
  cached = [f for f in os.listdir(tmp_path) if f.endswith(".npz")]
  assert cached == [
      os.path.basename(
          text_streams.stream_path(
              "wikitext_raw", data_dir, "valid", str(tmp_path), imported_gpt2
          )[0]
      )
  ]
  assert cached[0].startswith("wikitext103_raw.valid.v64.")
  assert text_streams.is_cached(
      "wikitext_raw",
      str(tmp_path / "gone"),
      "valid",
      str(tmp_path),
      imported_gpt2,
  )


def test_another_tokenizer_makes_another_cache(imported_gpt2, tmp_path):
  data_dir, texts = _text_dir(tmp_path / "text")
  other = str(tmp_path / "other")
  shutil.copytree(imported_gpt2, other)
  info = os.path.join(other, "vocab.json")
  with open(info, encoding="utf-8") as f:
    text = f.read().replace('"size": 64', '"size": 72')
  with open(info, "w", encoding="utf-8") as f:
    f.write(text)
  cache = str(tmp_path / "cache")
  a = text_streams.load_stream("text", data_dir, "train", cache, imported_gpt2)
  b = text_streams.load_stream("text", data_dir, "train", cache, other)
  np.testing.assert_array_equal(a.tokens, _tokenizer().encode(texts["train"]))
  np.testing.assert_array_equal(a.tokens, b.tokens)
  assert (a.vocab_size, b.vocab_size) == (64, 72)
  assert len([f for f in os.listdir(cache) if f.endswith(".npz")]) == 2


def test_the_run_reads_its_own_tokenizer_first(imported_gpt2, tmp_path):
  d = settings.Data(corpus="text", tokenizer=str(tmp_path))
  assert text_streams.tokenizer_dir(d, imported_gpt2) == imported_gpt2
  assert text_streams.tokenizer_dir(settings.Data(), str(tmp_path)) == ""
  with pytest.raises(errors.ConfigError, match="holds no imported tokenizer"):
    text_streams.tokenizer_dir(d, str(tmp_path / "new"))


def test_corpora_and_vocabularies_must_agree(imported_gpt2, tmp_path):
  e = settings.Eval()
  # A word-level corpus scored by an imported model: refused, not scored in
  # its own vocabulary.
  with pytest.raises(errors.ConfigError, match="has a vocabulary of its own"):
    corpus_lib.load_corpus(settings.Data(), e, imported_gpt2, train=False)
  # Raw text with no tokenizer to read it with.
  with pytest.raises(errors.ConfigError, match="is raw text"):
    corpus_lib.load_corpus(
        settings.Data(corpus="wikitext103_raw"),
        e,
        str(tmp_path / "w"),
        train=False,
    )


def test_documents_carry_the_bos_their_tokenizer_adds(imported_gpt2, tmp_path):
  bos_dir = tmp_path / "llama_bos"
  shutil.copytree(imported_gpt2, bos_dir)
  shutil.copy(
      os.path.join(FIXTURE.replace("gpt2", "llama_bos"), "tokenizer.json"),
      bos_dir / "tokenizer.json",
  )
  data_dir, texts = _text_dir(tmp_path / "text")
  plain = text_streams.load_stream(
      "text", data_dir, "valid", str(tmp_path / "c1"), imported_gpt2
  )
  led = text_streams.load_stream(
      "text", data_dir, "valid", str(tmp_path / "c2"), str(bos_dir)
  )
  np.testing.assert_array_equal(led.tokens, np.r_[1, plain.tokens])
  np.testing.assert_array_equal(led.doc_starts, [0])
  # The BOS windows begin with: the tokenizer's, none for GPT-2's or none.
  assert text_streams.window_bos(str(bos_dir)) == 1
  assert text_streams.window_bos(imported_gpt2) is None
  assert text_streams.window_bos("") is None
  assert (
      "v2 "
      in text_streams.stream_path(
          "text", data_dir, "valid", str(tmp_path / "c2"), str(bos_dir)
      )[1]
  )
