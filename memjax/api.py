"""The Python API: load a trained run or an export, score text, generate.

    import memjax
    model = memjax.load("runs/demo/trimelm")      # a workdir or an export
    r = model.score("the cat sat on the mat")      # per-token log-probs, ppl
    print(model.generate("the history of", num_tokens=30))
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

import json
from typing import Any, Optional, Sequence, Union

import numpy as np

from memjax import console
from memjax.eval import metrics
from memjax import experiment
from memjax import paths
from memjax import runfiles

TextOrTokens = Union[str, np.ndarray, Sequence[int]]


class LanguageModel:
  """A trained language model restored for scoring and generation.

  Attributes:
    config: the run's config (``ml_collections.ConfigDict``).
    step: training step of the parameters.
    unit: 'ppl' (word corpora) or 'bpc' (byte corpora).
    vocab: the corpus vocabulary.
    restored: the underlying ``experiment.Restored`` (model, params, mesh).
    memory: the evaluation-memory setting ``score`` uses ({'kind': 'none'}
      for none).
  """

  def __init__(self, restored: experiment.Restored):
    self.restored = restored
    self.config = restored.config
    self.step = restored.step
    self.unit = restored.unit
    self.vocab = restored.vocab
    self.memory = memory_setting(restored)
    self._scorers: dict[str, Any] = {}

  # -------------------------------------------------------------- text
  def encode(self, text: str) -> np.ndarray:
    """Text -> [n] int32 token ids (words split on spaces, or UTF-8 bytes)."""
    from memjax.data import vocab as vocab_lib  # pylint: disable=g-import-not-at-top

    if hasattr(self.vocab, "tokens"):
      return np.asarray(self.vocab.encode(text), np.int32)
    return vocab_lib.encode_bytes(text.encode("utf-8"))

  def decode(self, ids: Union[np.ndarray, Sequence[int]]) -> str:
    """[n] token ids -> text."""
    from memjax.modes import generate  # pylint: disable=g-import-not-at-top

    return generate.decode(self.vocab, np.asarray(ids))

  def _tokens(self, x: TextOrTokens) -> np.ndarray:
    if isinstance(x, str):
      return self.encode(x)
    return np.asarray(x, np.int32).reshape(-1)

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
    items = [self._tokens(x) for x in (inputs if many else [inputs])]
    setting = self.memory if memory else {"kind": "none"}
    scorer = self._scorer(setting)
    logprobs = [scorer.stream_logprobs(self.restored.params, t) for t in items]
    total = float(-sum(float(np.sum(lp, dtype=np.float64)) for lp in logprobs))
    count = float(sum(len(lp) for lp in logprobs))
    out = {"logprobs": logprobs, "memory": setting}
    out.update(metrics.summarize(total, count, self.unit))
    out["tokens"] = int(count)
    return out

  def _scorer(self, setting: dict[str, Any]) -> Any:
    """The run's scorer with ``setting`` (kept: one compilation)."""
    from memjax.eval import scorer as scorer_lib  # pylint: disable=g-import-not-at-top

    key = json.dumps(setting, sort_keys=True)
    if key not in self._scorers:
      self._scorers[key] = scorer_lib.scorer_for(
          self.restored, setting, workdir=self.restored.path
      )
    return self._scorers[key]

  # -------------------------------------------------------------- generate
  def generate(
      self,
      prompt: TextOrTokens,
      num_tokens: int = 64,
      *,
      top_p: float = 0.95,
      temperature: float = 1.0,
      seed: int = 0,
  ) -> Union[str, np.ndarray]:
    """Continues ``prompt`` by top-p sampling (memory carried by segments).

    Args:
      prompt: a text, or a token array [n >= 1].
      num_tokens: new tokens to draw.
      top_p: nucleus mass in (0, 1].
      temperature: divides the log-probabilities before filtering.
      seed: one seed gives one continuation.

    Returns:
      The continuation as text for a text prompt, else [num_tokens] int32
      token ids.
    """
    from memjax.modes import generate  # pylint: disable=g-import-not-at-top
    from memjax.eval import streams as recurrent_eval  # pylint: disable=g-import-not-at-top

    ids = self._tokens(prompt)
    r = self.restored
    model = r.model
    mem_len = int(self.config.generate.mem_len or self.config.model.mem_len)
    if model.carries_memory() and mem_len != model.mem_len:
      model = model.clone(mem_len=mem_len)
    sampler = generate.Sampler(
        model, recurrent_eval.segment_len_of(self.config), top_p=top_p,
        temperature=temperature,
    )  # fmt: skip
    new = sampler.generate(r.params, ids, int(num_tokens), int(seed))
    return self.decode(new) if isinstance(prompt, str) else new

  # -------------------------------------------------------------- export
  def export(
      self, out_dir: Optional[str] = None, dtype: str = "float32"
  ) -> str:
    """Writes a self-contained export (see ``memjax.export``)."""
    if self.restored.kind != "run":
      raise ValueError("this model was loaded from an export already")
    return export(self.restored.path, out_dir, dtype=dtype, step=self.step)

  def __repr__(self) -> str:
    r = self.restored
    return (
        f"LanguageModel({r.kind} {r.path}, step {r.step}, "
        f"{self.config.model.attention} attention, vocab {r.vocab_size}, "
        f"memory {self.memory})"
    )


def memory_setting(restored: experiment.Restored) -> dict[str, Any]:
  """The evaluation memory of a run: ``tune.json``'s choice, else the
  config's ``eval_memory`` (kind 'none' for plain models)."""
  from memjax.eval import scorer as scorer_lib  # pylint: disable=g-import-not-at-top

  return scorer_lib.memory_setting(restored)


def load(
    path: str,
    step: Optional[int] = None,
    *,
    mesh: Optional[dict[str, int]] = None,
) -> LanguageModel:
  """Restores a training workdir or an export for scoring and generation.

  Args:
    path: a workdir (``config.json`` + ``checkpoints/``) or an export.
    step: the checkpoint step of a workdir (None = latest).
    mesh: mesh axis sizes, e.g. {'data': 8} (default: all devices, data).
  """
  return LanguageModel(experiment.load(path, step=step, mesh=mesh))


def export(
    path: str,
    out_dir: Optional[str] = None,
    *,
    dtype: str = "float32",
    step: Optional[int] = None,
) -> str:
  """Writes ``path``'s parameters, config, vocabulary, signature and tuned
  memory setting to ``out_dir`` (default ``<workdir>/export``)."""
  out = experiment.export(path, out_dir, step=step, dtype=dtype)
  tuned = paths.join(path, "tune.json")
  if paths.isfile(tuned):
    paths.copy(tuned, paths.join(out, "tune.json"))
  return out


def _dir_size(path: str) -> int:
  """Bytes in the files under ``path``."""
  return paths.du(path)


def export_run(config: Any, workdir: str) -> dict[str, Any]:
  """``--mode=export``: writes ``export.dir`` (default ``<workdir>/export``)."""
  out = export(workdir, config.export.dir or None, dtype=config.export.dtype)
  meta = runfiles.RunFiles("export", out).read_json(runfiles.EXPORT_FILE)
  size = _dir_size(out)
  line = (
      f"exported step {meta['step']} ({meta['num_params']:,} parameters, "
      f"{meta['dtype']}) to {out}: {size / 2**20:.1f} MiB"
  )
  console.info("%s", line)
  return {"summary_lines": [line], "results_path": out, "export": out}
