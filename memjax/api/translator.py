"""``Translator``: an encoder-decoder translation run restored.

    mt = memjax.load("runs/demo_mt")
    mt.translate(["ein Haus .", "danke ."], beam=4)   # -> list of str
    mt.score(["ein Haus ."], ["a house ."])           # teacher-forced log p

Translation is ``memjax.tasks.translation``'s (``--mode=translate``): the
sentences are sorted by length, cut into batches of
``translation.decode_batch_size`` and padded to power-of-two source lengths,
so the jitted searches compile once per length bucket. ``score`` runs the
model through ``memjax.eval``'s rows scorer in batches padded the same way.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from memjax.api import base
from memjax.data import token_batching
from memjax.eval import rows
from memjax.eval import scorer as scorer_lib
from memjax.run import restore
from memjax.tasks import config as task_config
from memjax.tasks.translation import decoding
from memjax.tasks.translation import parts


class Translator(base.Loaded):
  """A trained encoder-decoder for translating and scoring sentences.

  Attributes:
    restored: the underlying ``memjax.run.restore.Restored``.
    settings: the run's settings; ``translation`` holds its decoding
      settings (length penalty, maximum length, batch size).
    vocab: the joint sentencepiece vocabulary.
  """

  def __init__(self, restored: restore.Restored):
    super().__init__(restored)
    self._translators: dict[Any, Any] = {}
    self._scorer = scorer_lib.scorer_for(restored.scoring())

  def _translator(self, memory: Any) -> Any:
    """The kept ``translator.Translator`` with ``memory`` as its hook."""
    key = id(memory)
    if key not in self._translators:
      r = self.restored
      t = self.settings.of(task_config.Translation)
      self._translators[key] = (
          parts.make_translator(t, r.model, r.variables, r.vocab, memory),
          memory,  # Keeps the hook alive, so its id stays its own.
      )
    return self._translators[key][0]

  def translate(
      self,
      sentences: Sequence[str],
      beam: int = 4,
      memory: Optional[decoding.LogProbHook] = None,
  ) -> list[str]:
    """Translations of ``sentences``, in order.

    Args:
      sentences: N source sentences (raw text).
      beam: K, the beam size (1: greedy search).
      memory: a ``decoding.LogProbHook`` that changes each step's
        log-probabilities (e.g. an external memory's, kNN-MT); None: the
        model alone.

    Returns:
      N detokenised translations.
    """
    _check_beam(beam)
    return self._translator(memory).translate(list(sentences), int(beam))

  def hypotheses(self, sentence: str, beam: int = 4) -> list[tuple[str, float]]:
    """Every finished hypothesis of the beam for ``sentence``, best first,
    with its score (sum of log-probabilities / length ** lenpen)."""
    _check_beam(beam)
    return self._translator(None).hypotheses(sentence, int(beam))

  def score(
      self, source: Sequence[str], target: Sequence[str]
  ) -> dict[str, Any]:
    """Teacher-forced log-probabilities of each target given its source.

    Args:
      source: N source sentences.
      target: N target sentences.

    Returns:
      {'logprobs': [float32 array [m_i + 1] per pair] (each target piece and
      the EOS), 'sentence_logprob': [N] float64 sums, 'nll': mean nats per
      target token, 'tokens': their number, 'ppl'}.
    """
    if len(source) != len(target):
      raise ValueError(f"{len(source)} sources but {len(target)} targets")
    tr = self._translator(None)
    src = [tr.encode(s) for s in source]
    tgt = [tr.encode(t) for t in target]
    size = rows.batch_rows(
        int(self.settings.eval.batch_size), self.restored.mesh
    )
    out = self._scorer.apply(
        self.restored.variables,
        _pair_batches(src, tgt, size),
        keep=("target_logprob",),
    )
    per_row = out.get("target_logprob", np.zeros((0, 1), np.float32))
    logprobs = [np.asarray(per_row[i, : len(t)]) for i, t in enumerate(tgt)]
    total = sum(float(np.sum(lp, dtype=np.float64)) for lp in logprobs)
    count = sum(len(lp) for lp in logprobs)
    return {
        "logprobs": logprobs,
        "sentence_logprob": np.asarray(
            [np.sum(lp, dtype=np.float64) for lp in logprobs]
        ),
        "nll": -total / max(count, 1),
        "tokens": count,
        "ppl": float(np.exp(-total / max(count, 1))),
    }


def _pair_batches(
    source: Sequence[np.ndarray], target: Sequence[np.ndarray], size: int
):
  """(batch, real rows) of pairs in input order, ``size`` rows each, source
  and target padded to power-of-two buckets (one compilation per pair of
  buckets; padding rows weigh 0)."""
  for first in range(0, len(source), size):
    src, tgt = source[first : first + size], target[first : first + size]
    real = len(src)
    empty = [np.zeros((0,), np.int32)] * (size - real)
    batch = token_batching.make_pair_batch(
        list(src) + empty,
        list(tgt) + empty,
        decoding.source_bucket(max(len(s) for s in src)),
        decoding.source_bucket(max(len(t) for t in tgt)),
    )
    yield batch, real


def _check_beam(beam: Any) -> None:
  """A beam of K >= 1 hypotheses (1: greedy search)."""
  if (
      isinstance(beam, bool)
      or not isinstance(beam, (int, np.integer))
      or beam < 1
  ):
    raise ValueError(f"beam must be an integer >= 1 (1: greedy), got {beam!r}")
