"""TokenizerVocabulary: a tokenizer.json as a memjax vocabulary."""

import json
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
      "eos_ids": [2],
  }
  # GPT-2's post-processor adds nothing: ids as without special tokens.
  assert vocab.added_bos is None and vocab.added_eos == ()
  assert ids == vocab.tokenizer.encode("the cat sat").ids


def _bos_text():
  with open(TOKENIZER.replace("gpt2", "llama_bos"), encoding="utf-8") as f:
    return f.read()


def test_text_is_encoded_with_the_bos_the_post_processor_adds():
  vocab = tokenizer_vocab.TokenizerVocabulary(_bos_text(), 64, 1, [2, 31])
  plain = vocab.tokenizer.encode("the cat sat", add_special_tokens=False).ids
  assert vocab.encode("the cat sat") == [1] + plain
  assert vocab.encode_prompt("the cat sat") == [1] + plain
  assert vocab.added_bos == 1 and vocab.added_eos == ()
  assert vocab.decode(vocab.encode("the cat sat")) == "the cat sat"
  assert vocab.eos_id == 2 and vocab.eos_ids == (2, 31)
  assert vocab.info()["eos_ids"] == [2, 31]


def test_a_post_processor_adding_eos_ends_texts_but_not_prompts():
  text = json.loads(_bos_text())
  text["post_processor"]["single"].append(
      {"SpecialToken": {"id": "</s>", "type_id": 0}}
  )
  text["post_processor"]["special_tokens"]["</s>"] = {
      "id": "</s>",
      "ids": [2],
      "tokens": ["</s>"],
  }
  vocab = tokenizer_vocab.TokenizerVocabulary(json.dumps(text), 64, 1, 2)
  plain = vocab.tokenizer.encode("the cat", add_special_tokens=False).ids
  assert vocab.encode("the cat") == [1] + plain + [2]
  assert vocab.encode_prompt("the cat") == [1] + plain
  assert (vocab.added_bos, vocab.added_eos) == (1, (2,))


def test_an_entry_written_before_eos_ids_reads_its_one_eos(tmp_path):
  path = tmp_path / "tokenizer.json"
  path.write_text(_text(), encoding="utf-8")
  info = {"kind": "tokenizer", "file": "tokenizer.json", "size": 64}
  old = tokenizer_vocab.TokenizerVocabulary.load(
      str(path), dict(info, bos=1, eos=2)
  )
  assert old.eos_ids == (2,) and old.eos_id == 2
  none = tokenizer_vocab.TokenizerVocabulary.load(
      str(path), dict(info, bos=None, eos=None)
  )
  assert none.eos_ids == () and none.eos_id is None


def test_a_tokenizer_larger_than_the_model_or_unreadable_is_an_error():
  with pytest.raises(errors.DataError, match="has 64 tokens but the model"):
    tokenizer_vocab.TokenizerVocabulary(_text(), 32)
  with pytest.raises(errors.DataError, match="not a readable tokenizer"):
    tokenizer_vocab.TokenizerVocabulary("{}", 32)
