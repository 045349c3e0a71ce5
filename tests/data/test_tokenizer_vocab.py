"""TokenizerVocabulary: a tokenizer.json as a memjax vocabulary."""

import os

import pytest

from memjax import errors
from memjax.data import tokenizer_vocab
from tests.conftest import REPO

TOKENIZER = os.path.join(
    REPO, "tests", "fixtures", "pretrained", "gpt2", "tokenizer.json"
)


def _text():
  with open(TOKENIZER, encoding="utf-8") as f:
    return f.read()


def test_encodes_decodes_and_pads_to_the_models_size(tmp_path):
  vocab = tokenizer_vocab.TokenizerVocabulary(_text(), 70, bos=1, eos=2)
  ids = vocab.encode("the cat sat")
  assert ids == vocab.encode(b"the cat sat") and len(ids) >= 3
  assert vocab.decode(ids) == "the cat sat"
  # 64 tokens of its own, 6 ids of padded embedding rows without text.
  assert vocab.vocab_size == 70 and len(vocab.tokens) == 70
  assert vocab.tokens[1] == "<s>" and vocab.tokens[69] == ""
  assert (vocab.bos_id, vocab.eos_id) == (1, 2)
  vocab.save(str(tmp_path / "tokenizer.json"))
  again = tokenizer_vocab.TokenizerVocabulary.load(
      str(tmp_path / "tokenizer.json"), vocab.info()
  )
  assert again.encode("the dog ran") == vocab.encode("the dog ran")
  assert again.info() == {
      "kind": "tokenizer",
      "file": "tokenizer.json",
      "size": 70,
      "bos": 1,
      "eos": 2,
  }


def test_a_tokenizer_larger_than_the_model_or_unreadable_is_an_error():
  with pytest.raises(errors.DataError, match="has 64 tokens but the model"):
    tokenizer_vocab.TokenizerVocabulary(_text(), 32)
  with pytest.raises(errors.DataError, match="not a readable tokenizer"):
    tokenizer_vocab.TokenizerVocabulary("{}", 32)
