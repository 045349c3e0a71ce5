"""Top-p sampling with the recurrent memory carried (``--mode=generate``).

The prompt is a window of a split (``generate.split``, ``prompt_offset``,
``prompt_len``); the continuation has ``generate.num_tokens`` tokens drawn by
top-p (nucleus) sampling (Holtzman et al. 2020; p = 0.95 in the LaMemo
paper, App. D), with PRNG keys ``fold_in(PRNGKey(seed), t)``, so a seed gives
one continuation.

How the memory is carried: by segments, exactly as in training and
evaluation. The text is cut into segments of T tokens (``eval.segment_len``
or ``data.seq_len``). Completed segments live only in the memory (M =
``generate.mem_len`` or ``model.mem_len``); the current, partial segment of
k tokens (1 <= k <= T) is run with that memory, padded to T, and the next
token is drawn from position k - 1 (attention is causal, and LaMemo's
look-ahead reads only the segment's first token, so the padding changes
nothing). When the segment is full and the next token has been drawn, the
segment is committed: the model runs it once more to update the memory
(Transformer-XL's push, LaMemo's look-ahead refresh and interpolation), and
the new token starts the next segment. Every token is therefore predicted
with the context it would have in a recurrent evaluation. Each step costs one
forward pass over M + T rows; two programs are compiled (predict, commit).

Models without memory (Transformer+RPE) slide a window of the last T
tokens instead. A decoder LM with the 'vanilla' kind decodes with a
key/value cache instead (``memjax.models.lm_decoding``: the prompt whole
in one call, then one cached step per token, the same PRNG keys).

A model imported with its tokenizer stops a continuation at the first
token that is one of its end-of-sequence ids (``stop_ids``: every EOS id
of its generation_config.json or config.json), that token included, as
Hugging Face's ``generate`` stops; memjax's own vocabularies stop nowhere
(WikiText's <eos> is a line break).

Writes ``<workdir>/generation.txt`` (settings, prompt, continuation),
``generation.json``, and prints the text.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from memjax import errors
from memjax.data import corpus as corpus_lib
from memjax.data import vocab as vocab_lib
from memjax.io import console
from memjax.io import paths
from memjax.models import lm_decoding
from memjax.models import variables as model_vars
from memjax.run import restore
from memjax.run import spec


@dataclasses.dataclass(frozen=True)
class Generate:
  """``config.generate``: --mode=generate, top-p sampling after a prompt
  from a split.

  Attributes:
    split: where the prompt comes from.
    prompt_offset: its first token in the split.
    prompt_len, num_tokens: the prompt's and the continuation's lengths.
    top_p, temperature: the sampling.
    mem_len: memory length (0 = model.mem_len).
    seed: the sampling's seed.
  """

  SECTION: ClassVar[str] = "generate"
  split: str = "test"
  prompt_offset: int = 0
  prompt_len: int = 512
  num_tokens: int = 256
  top_p: float = 0.95
  temperature: float = 1.0
  mem_len: int = 0
  seed: int = 0


Array = jax.Array


class Sampler:
  """Token-by-token sampling with the memory carried by segments."""

  def __init__(
      self, model, segment_len: int, *, top_p: float, temperature: float = 1.0
  ):
    """Creates the sampler.

    Args:
      model: a ``TransformerLM`` (with its memory length set).
      segment_len: T.
      top_p: nucleus mass.
      temperature: divides the log-probabilities before filtering.
    """
    self.model = model
    self.segment_len = int(segment_len)
    self.top_p = float(top_p)
    self.temperature = float(temperature)
    self.recurrent = model.carries_memory()

    def log_probs(params, memory, segment, k):
      def fn(mdl, segment, memory):
        out = mdl(segment, None, memory, deterministic=True)
        h = jax.lax.dynamic_index_in_dim(
            out.hidden, k - 1, axis=1, keepdims=False
        )  # [1, D]
        return mdl.log_probs(h)[0]

      return model.apply(
          model_vars.as_variables(params), segment, memory, method=fn
      )

    def commit(params, memory, segment):
      return model.apply(
          model_vars.as_variables(params),
          segment,
          None,
          memory,
          deterministic=True,
      ).memory

    self._log_probs = jax.jit(log_probs)
    self._commit = jax.jit(commit)
    # One row of the cached decoder's sampling (top-p, temperature).
    sampling = lm_decoding.Sampling(
        top_p=self.top_p, temperature=self.temperature
    )
    sampling.check()
    self._sample = jax.jit(
        lambda logp, key: sampling.choose(logp[None], key[None])[0]
    )

  def run(
      self,
      params: Any,
      prompt: Sequence[int],
      num_steps: int,
      choose: Callable[[int, Array], int],
      stop_ids: Sequence[int] = (),
  ) -> list[Array]:
    """Predicts ``num_steps`` next tokens after ``prompt``, one at a time.

    Args:
      params: model parameters.
      prompt: n >= 1 token ids.
      num_steps: how many next tokens to predict.
      choose: ``choose(t, log_probs [V]) -> token`` picks token t (sampling,
        or the known next token for scoring).
      stop_ids: ids that end the run once chosen.

    Returns:
      The log-probability vectors [V] the choices were made from:
      ``num_steps``, fewer when a stop id was chosen.
    """
    buffer = [int(t) for t in prompt]
    if not buffer:
      raise errors.ConfigError("generate.prompt_len must be >= 1")
    t_len = self.segment_len
    memory = self.model.init_memory(1)

    def settle(buffer, memory):
      """Commits full segments so that 1 <= len(buffer) <= T."""
      while len(buffer) > t_len:
        if self.recurrent:
          memory = self._commit(
              params, memory, jnp.asarray([buffer[:t_len]], jnp.int32)
          )
          buffer = buffer[t_len:]
        else:
          buffer = buffer[-t_len:]
      return buffer, memory

    buffer, memory = settle(buffer, memory)
    stop = {int(i) for i in stop_ids}
    out = []
    for t in range(num_steps):
      k = len(buffer)
      segment = np.zeros((1, t_len), np.int32)
      segment[0, :k] = buffer
      logp = self._log_probs(params, memory, jnp.asarray(segment), jnp.int32(k))
      out.append(logp)
      chosen = int(choose(t, logp))
      if chosen in stop:
        break
      buffer, memory = settle(buffer + [chosen], memory)
    return out

  def generate(
      self,
      params: Any,
      prompt: np.ndarray,
      num_tokens: int,
      seed: int,
      stop_ids: Sequence[int] = (),
  ) -> np.ndarray:
    """Returns [<= num_tokens] int32 tokens that continue ``prompt``
    [n >= 1]: ``num_tokens``, or up to and with the first of ``stop_ids``
    drawn."""
    key = jax.random.PRNGKey(seed)
    tokens = []

    def choose(t, logp):
      tokens.append(int(self._sample(logp, jax.random.fold_in(key, t))))
      return tokens[-1]

    self.run(
        params, np.asarray(prompt).reshape(-1), num_tokens, choose, stop_ids
    )
    return np.asarray(tokens, np.int32)

  def score(self, params: Any, tokens: np.ndarray) -> np.ndarray:
    """[n - 1] float32 log p(tokens[i + 1] | tokens[:i + 1]), predicted the
    way ``generate`` predicts (for checking it against evaluation)."""
    tokens = np.asarray(tokens).reshape(-1)
    logps = self.run(
        params, tokens[:1], len(tokens) - 1, lambda t, _: int(tokens[t + 1])
    )
    return np.asarray(
        [float(lp[tokens[t + 1]]) for t, lp in enumerate(logps)], np.float32
    )


def stop_ids(vocab: Any) -> tuple[int, ...]:
  """The ids a continuation stops at: an imported tokenizer's EOS ids
  (``eos_ids``); none for memjax's own vocabularies."""
  return tuple(int(i) for i in getattr(vocab, "eos_ids", ()))


def decode(vocab: Any, ids: np.ndarray) -> str:
  """Token ids to text (words joined by spaces, or UTF-8 bytes)."""
  ids = np.asarray(ids)
  if hasattr(vocab, "tokens"):  # WordVocabulary
    return vocab.decode([int(i) for i in ids])
  return vocab_lib.decode_bytes(ids).decode("utf-8", errors="replace")


def _continue(
    model: Any,
    variables: Any,
    prompt: np.ndarray,
    g: Generate,
    segment_len: int,
    stops: Sequence[int],
) -> np.ndarray:
  """[<= num_tokens] int32 tokens after ``prompt``: by key/value-cache
  decoding where the model has it (``lm_decoding``), else by ``Sampler``."""
  if lm_decoding.unsupported(model) is None:
    console.info("decoding with a key/value cache")
    sampling = lm_decoding.Sampling(
        top_p=float(g.top_p), temperature=float(g.temperature)
    )
    decoder = lm_decoding.CachedDecoder(model)
    return decoder.generate(
        variables, [prompt], int(g.num_tokens), sampling, [int(g.seed)], stops
    )[0]
  sampler = Sampler(
      model, segment_len, top_p=float(g.top_p), temperature=float(g.temperature)
  )
  return sampler.generate(
      variables, prompt, int(g.num_tokens), int(g.seed), stops
  )


def generate(run: spec.Run) -> dict[str, Any]:
  """``--mode=generate``: continues a prompt from a split (see module doc)."""
  s, workdir = run.settings, run.workdir
  g = s.of(Generate)
  restored = restore.restore_source(run)
  corpus = corpus_lib.load_corpus(s.data, s.eval, workdir, train=False)
  if g.split not in corpus.splits:
    raise errors.ConfigError(
        f"generate.split {g.split!r} is not in eval.splits "
        f"{tuple(s.eval.splits)}"
    )
  tokens = corpus.splits[g.split].tokens
  start, length = int(g.prompt_offset), int(g.prompt_len)
  if length < 1 or start < 0 or start + length > len(tokens):
    raise errors.ConfigError(
        f"generate.prompt_offset {start} + prompt_len {length} must lie "
        f"within the {g.split} split's {len(tokens)} tokens"
    )
  prompt = np.asarray(tokens[start : start + length])
  model = restored.model
  mem_len = int(g.mem_len or s.model.mem_len)
  if model.carries_memory() and mem_len != model.cfg.mem_len:
    model = model.with_settings(mem_len=mem_len)
  seg = int(s.eval.segment_len or s.data.seq_len)
  console.info(
      "generating %d tokens after a %d-token prompt (%s[%d:%d]), "
      "top-p %.2f, segments of %d, memory %d",
      int(g.num_tokens),
      length,
      g.split,
      start,
      start + length,
      float(g.top_p),
      seg,
      model.cfg.mem_len if model.carries_memory() else 0,
  )
  vocab = restored.vocab
  new = _continue(model, restored.variables, prompt, g, seg, stop_ids(vocab))
  prompt_text, new_text = decode(vocab, prompt), decode(vocab, new)
  header = (
      f"model {s.name}, step {restored.step}; prompt "
      f"{g.split}[{start}:{start + length}]; {int(g.num_tokens)} tokens, "
      f"top-p {float(g.top_p)}, temperature {float(g.temperature)}, "
      f"seed {int(g.seed)}, segments of {seg}, memory "
      f"{model.cfg.mem_len if model.carries_memory() else 0}"
  )
  text = (
      f"{header}\n\n=== prompt ===\n{prompt_text}\n\n"
      f"=== continuation ===\n{new_text}\n"
  )
  files = [
      paths.join(workdir, "generation.txt"),
      paths.join(workdir, "generation.json"),
  ]
  paths.write_text(files[0], text)
  result = {
      "name": s.name,
      "step": restored.step,
      "header": header,
      "prompt": prompt_text,
      "continuation": new_text,
      "prompt_ids": prompt.tolist(),
      "ids": new.tolist(),
  }
  paths.write_json(files[1], result, sort_keys=False)
  print(text, flush=True)
  result["files"] = files
  return result
