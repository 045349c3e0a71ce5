"""``LanguageModel``: a decoder LM restored for scoring and generation.

    import memjax
    model = memjax.load("runs/demo/trimelm")      # a workdir or an export
    r = model.score("the cat sat on the mat")      # per-token log-probs, ppl
    print(model.generate(["the history of", "in"], num_tokens=30))
    model.export()                                 # <workdir>/export

Scoring follows the evaluation of the command line exactly: models without
recurrent memory slide the windows of ``eval.window_len`` /
``eval.score_len`` over each input, with the run's evaluation memory (the
setting ``--mode=tune`` chose and wrote to ``tune.json``, else the config's
``eval_memory``); models with recurrent memory (Transformer-XL, LaMemo) run
the input in segments and carry their memory. So ``score`` on a split's
tokens reproduces ``--mode=eval`` (or ``--mode=memeval`` for a memory
model).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Optional, Sequence, Union

import numpy as np

from memjax import errors
from memjax import settings as settings_lib
from memjax.api import base
from memjax.eval import metrics
from memjax.eval import scorer as scorer_lib
from memjax.io import paths
from memjax.run import restore

TextOrTokens = Union[str, np.ndarray, Sequence[int]]


class LanguageModel(base.Loaded):
  """A trained language model restored for scoring and generation.

  Attributes:
    settings: the run's settings (``memjax.settings.Settings``).
    config: the run's config (``ml_collections.ConfigDict``), as saved.
    step: training step of the parameters.
    unit: 'ppl' (word corpora) or 'bpc' (byte corpora).
    vocab: the corpus vocabulary.
    restored: the underlying ``memjax.run.restore.Restored`` (model,
      params, mesh).
    memory: the evaluation-memory setting ``score`` uses ({'kind': 'none'}
      for none).
  """

  def __init__(self, restored: restore.Restored):
    super().__init__(restored)
    self.unit = restored.unit
    self.memory = memory_setting(restored)
    self._scorers: dict[str, Any] = {}
    self._decoders: dict[Any, Any] = {}  # Kept compilations (generate).

  # -------------------------------------------------------------- text
  def encode(self, text: str) -> np.ndarray:
    """Text -> [n] int32 token ids (words split on spaces, UTF-8 bytes, or
    an imported tokenizer's ids with the BOS/EOS its post-processor adds)."""
    from memjax.modes import generate  # pylint: disable=g-import-not-at-top

    return generate.encode(self.vocab, text)

  def decode(self, ids: Union[np.ndarray, Sequence[int]]) -> str:
    """[n] token ids -> text."""
    from memjax.modes import generate  # pylint: disable=g-import-not-at-top

    return generate.decode(self.vocab, np.asarray(ids))

  def _tokens(self, x: TextOrTokens) -> np.ndarray:
    if isinstance(x, str):
      return self.encode(x)
    return np.asarray(x, np.int32).reshape(-1)

  def _prompt(self, x: TextOrTokens) -> np.ndarray:
    """A prompt's ids: a text encoded as ``encode`` does, less an EOS the
    tokenizer puts after a text (``encode_prompt``)."""
    from memjax.modes import generate  # pylint: disable=g-import-not-at-top

    if isinstance(x, str):
      return generate.encode_prompt(self.vocab, x)
    return self._tokens(x)

  # -------------------------------------------------------------- score
  def score(
      self,
      inputs: Union[TextOrTokens, Sequence[TextOrTokens]],
      *,
      memory: bool = True,
  ) -> dict[str, Any]:
    """Log-probabilities of every token given its prefix.

    Args:
      inputs: a text, a token array [n], or a list of either; each input is
        scored as its own stream (its first token is context only).
      memory: use the run's evaluation memory (see class doc); False scores
        the plain model.

    Returns:
      {'logprobs': [float32 array [n_i - 1] per input], 'nll': mean nats per
      scored token, 'tokens': number of scored tokens, and 'ppl' or 'bpc'},
      plus 'memory' (the setting used).
    """
    many = isinstance(inputs, (list, tuple)) and not (
        inputs and isinstance(inputs[0], (int, np.integer))
    )
    given = list(inputs if many else [inputs])
    items = [self._tokens(x) for x in given]
    for i, t in enumerate(items):
      if len(t) < 2:
        raise ValueError(
            f"score: input {i} ({given[i]!r}) has {len(t)} token(s) and "
            "nothing to score: the first token (a BOS where the tokenizer "
            "adds one) is context only; give at least two"
        )
    setting = self.memory if memory else {"kind": "none"}
    scorer = self._scorer(setting)
    logprobs = [
        scorer.stream_logprobs(self.restored.variables, t) for t in items
    ]
    total = float(-sum(float(np.sum(lp, dtype=np.float64)) for lp in logprobs))
    count = float(sum(len(lp) for lp in logprobs))
    out = {"logprobs": logprobs, "memory": setting}
    out.update(metrics.summarize(total, count, self.unit))
    out["tokens"] = int(count)
    return out

  def attach(
      self,
      datastore: str,
      setting: Optional[dict[str, Any]] = None,
      **eval_memory: Any,
  ) -> "LanguageModel":
    """Scores with an external memory (kNN-LM, TRIMELM_ext) from now on.

    Args:
      datastore: the datastore directory ``--mode=datastore`` wrote (e.g.
        ``<workdir>/datastore``).
      setting: the evaluation memory, e.g. {'kind': 'knn', 'knn_lambda':
        0.25, ...}; None: the ``tune.json`` beside the datastore (what
        ``--mode=tune`` chose there), else the run's setting.
      **eval_memory: other ``eval_memory`` keys of the search (``ext_k``,
        ``search``, ``leaves_to_search``...).

    Returns:
      self, scoring with the datastore.

    Raises:
      errors.DataError: no datastore at ``datastore``.
    """
    if not paths.isfile(paths.join(datastore, "manifest.json")):
      raise errors.DataError(
          f"{datastore} holds no datastore (manifest.json): build one with "
          "--mode=datastore"
      )
    tuned = paths.join(paths.dirname(paths.resolve(datastore)), "tune.json")
    if setting is None and paths.isfile(tuned):
      t = paths.read_json(tuned)
      setting = {"kind": t["kind"], **t["best"], "source": tuned}
    s = self.settings.replace(
        settings_lib.replaced(
            self.settings.eval_memory, datastore=datastore, **eval_memory
        )
    )
    run = self.restored.run.replace(*s.sections.values())
    self.restored = dataclasses.replace(self.restored, run=run)
    self.settings = s
    self.memory = dict(setting or self.memory)
    self._scorers.clear()
    self._decoders.clear()  # A reader holds the datastore it searches.
    return self

  def _scorer(self, setting: dict[str, Any]) -> Any:
    """The run's scorer with ``setting`` (kept: one compilation)."""
    key = json.dumps(setting, sort_keys=True)
    if key not in self._scorers:
      self._scorers[key] = scorer_lib.scorer_for(
          self.restored.scoring(), setting, workdir=self.restored.path
      )
    return self._scorers[key]

  # -------------------------------------------------------------- generate
  def generate(
      self,
      prompts: Union[TextOrTokens, Sequence[TextOrTokens]],
      num_tokens: int = 64,
      *,
      top_p: float = 0.95,
      temperature: float = 1.0,
      seed: int = 0,
      greedy: bool = False,
      top_k: int = 0,
      batch_size: int = 0,
      memory: Union[bool, dict[str, Any]] = False,
  ) -> Any:
    """Continues each prompt: greedy, or sampled (temperature, top-k, top-p).

    As ``--mode=generate`` (``memjax.modes.generate.continue_prompts``):
    the prompts are decoded in batches with a key/value cache
    (``memjax.models.lm_decoding.decoder``: prefill, then one cached step
    per token), each token reading the context evaluation gives its prefix
    (evaluation's windows, or the recurrent memory by segments).

    Args:
      prompts: a text or a token array [n >= 1], or a list of either.
      num_tokens: new tokens per prompt (at most).
      top_p: nucleus mass in (0, 1].
      temperature: divides the log-probabilities before filtering.
      seed: one seed gives one continuation (prompt i draws with seed + i).
      greedy: take the most likely token.
      top_k: keep the k most likely tokens before top-p (0 = all).
      batch_size: prompts decoded together (0 = all of them).
      memory: draw each token from the distribution ``score`` gives its
        prefix with an evaluation memory (``memjax.memory.generation``):
        True, the run's (``self.memory``), or a setting ({'kind': 'trime',
        'temperature': 1.0}), through evaluation's windows.

    Returns:
      Per prompt, the continuation as text for a text prompt, else
      [num_tokens] int32 token ids (fewer when an imported model draws one
      of its EOS ids: the continuation ends with it); a list for a list of
      prompts.

    Raises:
      ValueError: an empty prompt.
      errors.ConfigError: a sampling setting out of range, a model that
        is not a decoder LM, or a memory with a model that carries its
        own.
    """
    from memjax.models import decode_windows  # pylint: disable=g-import-not-at-top
    from memjax.models import sampling as sampling_lib  # pylint: disable=g-import-not-at-top
    from memjax.modes import generate as generate_lib  # pylint: disable=g-import-not-at-top

    many = isinstance(prompts, (list, tuple)) and not (
        prompts and isinstance(prompts[0], (int, np.integer))
    )
    items = list(prompts if many else [prompts])
    ids = self._prompt_ids(items)
    sampling = sampling_lib.Sampling(
        bool(greedy), int(top_k), float(top_p), float(temperature)
    )
    sampling.check()
    new = generate_lib.continue_prompts(
        generate_lib.generation_model(self.restored.model, self.settings),
        self.restored.variables,
        ids,
        int(num_tokens),
        sampling,
        [int(seed) + i for i in range(len(ids))],
        generate_lib.stop_ids(self.vocab),
        self.restored.scoring().segment_len,
        batch_size=int(batch_size),
        kept=self._decoders,
        reader=self._reader(memory),
        windows=decode_windows.Windows.of(self.restored.scoring()),
        restored=self.restored,
    )
    out = [
        self.decode(n) if isinstance(p, str) else n for p, n in zip(items, new)
    ]
    return out if many else out[0]

  def _prompt_ids(self, items: Sequence[TextOrTokens]) -> list[np.ndarray]:
    """Each prompt's ids (``_prompt``); ValueError for an empty one."""
    ids = [self._prompt(p) for p in items]
    for i, x in enumerate(ids):
      if not len(x):
        raise ValueError(
            f"generate: prompt {i} is empty ({items[i]!r}); give each prompt "
            "at least one token of text"
        )
    return ids

  def _reader(self, memory: Union[bool, dict[str, Any]]) -> Any:
    """``generate``'s memory reader (``modes.generate.memory_reader``):
    None for False; ValueError for True on a run without a memory."""
    from memjax.modes import generate as generate_lib  # pylint: disable=g-import-not-at-top

    setting = self.memory if memory is True else (memory or None)
    reader = generate_lib.memory_reader(self.restored.scoring(), setting)
    if memory is True and reader is None:
      raise ValueError(
          "generate(memory=True): this run has no evaluation memory; pass "
          "a setting, e.g. memory={'kind': 'trime', 'temperature': 1.0}"
      )
    return reader

  def __repr__(self) -> str:
    r = self.restored
    return (
        f"LanguageModel({r.kind} {r.path}, step {r.step}, "
        f"{self.settings.model.attention} attention, vocab {r.vocab_size}, "
        f"memory {self.memory})"
    )


def memory_setting(restored: restore.Restored) -> dict[str, Any]:
  """The evaluation memory of a run: ``tune.json``'s choice, else the
  settings' ``eval_memory`` (kind 'none' for plain models)."""
  return scorer_lib.memory_setting(restored.scoring())
