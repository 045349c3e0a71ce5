"""Translating sentences with a trained encoder-decoder, in batches.

Sentences are sorted by length, cut into batches of ``batch_size`` and
padded to a few source lengths (powers of two), so the jitted searches of
``decoding`` compile once per length; output is detokenised by the
sentencepiece vocabulary.
"""

from __future__ import annotations

import time
from typing import Any, Optional, Sequence

import jax
import numpy as np

from memjax.io import console
from memjax.data import token_batching
from memjax.tasks.translation import decoding


class Translator:
  """Greedy or beam translation of sentences.

  Attributes:
    model: the ``EncoderDecoder``.
    params: its parameters.
    vocab: the joint ``seqio.SentencePieceVocabulary``.
    beam_size: K (1 = greedy search).
    length_penalty: fairseq's lenpen.
    max_len_a, max_len_b: at most a * source length + b target tokens.
    batch_size: sentences per decoding batch.
    hook: ``decoding.LogProbHook`` or None.
  """

  def __init__(
      self,
      model: Any,
      params: Any,
      vocab: Any,
      *,
      beam_size: int = 4,
      length_penalty: float = 1.0,
      max_len_a: float = 1.2,
      max_len_b: int = 10,
      batch_size: int = 32,
      hook: Optional[decoding.LogProbHook] = None,
  ):
    self.model, self.params, self.vocab = model, params, vocab
    self.beam_size = int(beam_size)
    self.length_penalty = float(length_penalty)
    self.max_len_a, self.max_len_b = float(max_len_a), int(max_len_b)
    self.batch_size = int(batch_size)
    self.hook = hook

  def encode(self, sentence: str) -> np.ndarray:
    """Source ids of a sentence, ending in EOS."""
    ids = list(self.vocab.encode(sentence))
    return np.asarray(ids + [decoding.EOS], np.int32)

  def _search(self, source: np.ndarray, beam: int):
    s = source.shape[1]
    max_len = min(
        decoding.max_target_len(s, self.max_len_a, self.max_len_b),
        self.model.cfg.max_len,
    )
    kind = "greedy" if beam == 1 else "beam"
    fn = decoding._jitted(  # pylint: disable=protected-access
        self.model, kind, max_len, beam, self.length_penalty, self.hook
    )
    return fn(self.params, source)

  def batches(self, sources: Sequence[np.ndarray]):
    """Yields (indices, [batch_size, S] padded sources), shortest first."""
    order = np.argsort([len(s) for s in sources], kind="stable")
    for i in range(0, len(order), self.batch_size):
      idx = order[i : i + self.batch_size]
      rows = [sources[j] for j in idx]
      rows += [np.zeros((0,), np.int32)] * (self.batch_size - len(rows))
      length = decoding.source_bucket(max(len(r) for r in rows))
      yield idx, token_batching.pad_rows(rows, length)

  def translate_ids(
      self,
      sources: Sequence[np.ndarray],
      beam_size: Optional[int] = None,
      desc: str = "",
  ) -> list[list[int]]:
    """Target ids (no EOS) of source id arrays, in input order."""
    beam = self.beam_size if beam_size is None else int(beam_size)
    out: list[list[int]] = [[] for _ in sources]
    start, done = time.time(), 0
    for idx, src in self.batches(sources):
      res = self._search(src, beam)
      tokens = res if beam == 1 else res.tokens
      tokens = np.asarray(jax.device_get(tokens))
      for row, j in enumerate(idx):
        out[j] = decoding.strip(tokens[row])
      done += len(idx)
      if desc:
        console.info(
            "%s: %d/%d sentences (%.1f s)",
            desc,
            done,
            len(sources),
            time.time() - start,
        )
    return out

  def translate(
      self,
      sentences: Sequence[str],
      beam_size: Optional[int] = None,
      desc: str = "",
  ) -> list[str]:
    """Detokenised translations of ``sentences``, in order."""
    ids = self.translate_ids(
        [self.encode(s) for s in sentences], beam_size, desc
    )
    return [self.vocab.decode(x) for x in ids]

  def hypotheses(
      self, sentence: str, beam_size: Optional[int] = None
  ) -> list[tuple[str, float]]:
    """The beam's finished hypotheses of one sentence with their scores
    (sum of log-probabilities / length ** lenpen), best first (beam
    ``beam_size``, default the translator's, at least 2)."""
    src = self.encode(sentence)
    padded = token_batching.pad_rows([src], decoding.source_bucket(len(src)))
    beam = self.beam_size if beam_size is None else int(beam_size)
    res = self._search(padded, max(2, beam))
    hyps = np.asarray(res.hypotheses[0])
    scores = np.asarray(res.scores[0])
    return [
        (self.vocab.decode(decoding.strip(h)), float(sc))
        for h, sc in zip(hyps, scores)
        if sc > decoding.NEG / 2
    ]
