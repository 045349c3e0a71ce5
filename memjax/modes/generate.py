"""``--mode=generate``: continuations of prompts, by key/value-cache decoding.

The prompts: a window of a split (``generate.split``, ``prompt_offset``,
``prompt_len``), or every prompt of a file (``generate.prompts``: one text
per line, or JSON lines with a ``"prompt"`` each), decoded in batches of
``generate.batch_size``. Each continuation has up to
``generate.num_tokens`` tokens, greedy (``generate.greedy``) or drawn with
temperature, top-k and top-p (nucleus) filtering (Holtzman et al. 2020; p =
0.95 in the LaMemo paper, App. D), prompt i with PRNG keys
``fold_in(PRNGKey(seed + i), t)``, so a seed gives one continuation.

Every decoder LM decodes with a key/value cache (``lm_decoding.decoder``:
a prefill, then one cached step per token, all in one compiled loop), and
each token reads the context evaluation gives its prefix: a model without
recurrent memory evaluation's sliding windows (``eval.window_len`` /
``score_len``, ``models.decode_windows``); Transformer-XL the memory of M
positions before its segment of ``eval.segment_len`` or ``data.seq_len``
T; LaMemo its memory refreshed by look-ahead at each segment's start
(``methods.recurrent.lamemo_decoding``). Other families (MARGE, which
reads retrieved sources, and the encoders) are refused in one line.

With ``generate.memory`` (``memjax.load(W).generate(..., memory=True)``),
every step reads the run's evaluation memory (``memjax.memory.generation``):
TRIME's testing memory or the continuous cache over the decoded context,
or a datastore's neighbours (kNN-LM, TRIMELM_ext: searched on the host),
so the distribution each token is drawn from is the one ``--mode=memeval``
gives that prefix: the context of evaluation's sliding windows
(``eval.window_len`` / ``score_len``) and the long-term memory of
``eval_memory.long_mem_tokens`` pairs before a window, for a prompt and
a continuation of any length.

A model imported with its tokenizer stops a continuation at the first
token that is one of its end-of-sequence ids (``stop_ids``: every EOS id
of its generation_config.json or config.json), that token included, as
Hugging Face's ``generate`` stops; memjax's own vocabularies stop nowhere
(WikiText's <eos> is a line break).

Writes ``<workdir>/generation.txt`` (settings, prompt, continuation) and
``generation.json`` for a split's prompt and prints the text; writes
``<workdir>/generations.jsonl`` for a file of prompts (one line per prompt:
its index, text, ids, continuation and why it stopped) and prints each.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, ClassVar, Optional, Sequence

import numpy as np

from memjax import errors
from memjax.data import corpus as corpus_lib
from memjax.data import vocab as vocab_lib
from memjax.eval import external as external_lib
from memjax.eval import grid as grid_lib
from memjax.eval import scorer as scorer_lib
from memjax.io import console
from memjax.io import paths
from memjax.memory import generation
from memjax.models import decode_windows
from memjax.models import lm_decoding
from memjax.models import sampling as sampling_lib
from memjax.run import restore
from memjax.run import spec


@dataclasses.dataclass(frozen=True)
class Generate:
  """``config.generate``: --mode=generate, continuations of prompts.

  Attributes:
    split: where the prompt comes from (without ``prompts``).
    prompt_offset: its first token in the split.
    prompt_len, num_tokens: the prompt's and the continuation's lengths.
    prompts: a file of prompts (a local path or a URL): one text per line,
      or, for a ``.jsonl`` file, one JSON object with a ``"prompt"`` text
      per line; '' = the split's window above.
    batch_size: prompts decoded together (key/value-cache decoding).
    greedy: take the most likely token.
    top_k: keep the k most likely tokens (0 = all; cached decoding only).
    top_p, temperature: the sampling.
    mem_len: memory length (0 = model.mem_len).
    seed: the sampling's seed (prompt i draws with seed + i).
    memory: read the run's evaluation memory at every step (the setting
      ``memjax.load(W).score`` uses: ``tune.json``'s choice, else
      ``eval_memory.kind`` at its method's settings), so each step's
      distribution is the one ``--mode=memeval`` scores (its windows and
      long-term memory).
  """

  SECTION: ClassVar[str] = "generate"
  split: str = "test"
  prompt_offset: int = 0
  prompt_len: int = 512
  num_tokens: int = 256
  prompts: str = ""
  batch_size: int = 8
  greedy: bool = False
  top_k: int = 0
  top_p: float = 0.95
  temperature: float = 1.0
  mem_len: int = 0
  seed: int = 0
  memory: bool = False

  def sampling(self) -> sampling_lib.Sampling:
    """The token choice these settings give (checked)."""
    out = sampling_lib.Sampling(
        bool(self.greedy),
        int(self.top_k),
        float(self.top_p),
        float(self.temperature),
    )
    out.check("generate.")
    return out


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


def continue_prompts(
    model: Any,
    variables: Any,
    prompts: Sequence[np.ndarray],
    num_tokens: int,
    sampling: sampling_lib.Sampling,
    seeds: Sequence[int],
    stops: Sequence[int],
    segment_len: int,
    *,
    batch_size: int = 0,
    kept: Optional[dict[Any, Any]] = None,
    reader: Optional[generation.MemoryReader] = None,
    windows: Optional[decode_windows.Windows] = None,
    restored: Any = None,
    say: bool = False,
) -> list[np.ndarray]:
  """Per prompt [n >= 1], up to ``num_tokens`` int32 tokens (to and with
  the first of ``stops``), by key/value-cache decoding
  (``lm_decoding.decoder``, ``batch_size`` prompts at a time; 0 = all).

  Args:
    model: the restored model.
    variables: its variables.
    prompts: token ids per prompt.
    num_tokens: new tokens per prompt, at most.
    sampling: the token choice (checked by the caller).
    seeds: one per prompt.
    stops: ids that end a continuation.
    segment_len: T, the segments of a model with recurrent memory.
    batch_size: prompts decoded together.
    kept: a dict to keep the compiled decoders in between calls
      (``memjax.load(W).generate``), or None.
    reader: an evaluation memory read at every step (``memory_reader``),
      or None.
    windows: evaluation's windows (``decode_windows.Windows.of``), which a
      model without recurrent memory keeps (a reader keeps its own); None
      reads every earlier position.
    restored: the restored run, for a decoder that reads more of it
      (``CachedDecoder.prepare_run``: MARGE's index), or None.
    say: say on the console what each token reads
      (``CachedDecoder.describe``).

  Raises:
    errors.ConfigError: a model that is not a decoder LM, or a memory with
      a model that carries its own or reads retrieved sources.
  """
  kept = {} if kept is None else kept
  why = lm_decoding.unsupported(model)
  if why is not None:
    raise errors.ConfigError(
        f"generate: {why}; generation decodes decoder LMs (model.family "
        "'decoder_lm')"
    )
  _check_reader(model, reader)
  if model.carries_memory():
    windows = None  # Segments, as recurrent evaluation runs them.
  key = ("decoder", reader, int(segment_len), windows)
  if key not in kept:
    kept[key] = lm_decoding.decoder(model, reader, segment_len, windows)
  decoder = kept[key]
  if restored is not None:
    decoder.prepare_run(restored, variables)
  if say:
    console.info("decoding with a key/value cache%s", decoder.describe())
  size = int(batch_size) or len(prompts)
  out = []
  for b in range(0, len(prompts), size):
    out += decoder.generate(
        variables,
        prompts[b : b + size],
        int(num_tokens),
        sampling,
        seeds[b : b + size],
        stops,
    )
  return out


def _check_reader(
    model: Any, reader: Optional[generation.MemoryReader]
) -> None:
  """Raises errors.ConfigError for a memory with a model that carries a
  recurrent memory of its own."""
  if reader is not None and model.carries_memory():
    raise errors.ConfigError(
        f"generate with the {reader.kind} memory: this model carries its "
        "own memory; set generate.memory=False"
    )


def memory_reader(
    scoring: Any, setting: Optional[dict[str, Any]]
) -> Optional[generation.MemoryReader]:
  """The reader of an evaluation-memory setting ({'kind', <axis keys>...},
  as ``scorer.memory_setting`` gives it) for a restored run's ``scoring``;
  None for kind 'none'."""
  if not setting or setting.get("kind", "none") == "none":
    return None
  grid = grid_lib.grid_of(setting, scoring.memories)
  metric, search = grid.memory.external_metric, None
  if metric:  # The datastore and search evaluation reads.
    search = external_lib.external_search(scoring, metric, scoring.path)
  return generation.MemoryReader.of(grid, scoring, search)


def run_memory(restored: Any) -> generation.MemoryReader:
  """``generate.memory``: the reader of the run's evaluation memory.

  Raises:
    errors.ConfigError: the run has none.
  """
  scoring = restored.scoring()
  reader = memory_reader(scoring, scorer_lib.memory_setting(scoring))
  if reader is None:
    raise errors.ConfigError(
        "generate.memory: this run has no evaluation memory (set "
        "eval_memory.kind to trime or cache)"
    )
  return reader


def read_prompts(path: str) -> list[str]:
  """The texts of a prompts file: its non-empty lines, or for a ``.jsonl``
  file each line's ``"prompt"``.

  Raises:
    errors.DataError: no such file, a line that is not a JSON object with
      a "prompt" text, or no prompt at all.
  """
  if not paths.isfile(path):
    raise errors.DataError(f"generate.prompts: no file {path}")
  lines = [line for line in paths.read_text(path).splitlines() if line.strip()]
  if not path.endswith(".jsonl"):
    texts = lines
  else:
    texts = []
    for n, line in enumerate(lines, 1):
      try:
        item = json.loads(line)
      except json.JSONDecodeError:
        item = None
      if not isinstance(item, dict) or not isinstance(item.get("prompt"), str):
        raise errors.DataError(
            f"generate.prompts: line {n} of {path} is not a JSON object "
            f'with a "prompt" text: {line[:80]!r}'
        )
      texts.append(item["prompt"])
  if not texts:
    raise errors.DataError(f"generate.prompts: {path} holds no prompt")
  return texts


def encode(vocab: Any, text: str) -> np.ndarray:
  """Text -> [n] int32 ids: words split on spaces, UTF-8 bytes, or an
  imported tokenizer's ids with the BOS/EOS its post-processor adds."""
  if hasattr(vocab, "tokens") or hasattr(vocab, "encode_prompt"):
    return np.asarray(vocab.encode(text), np.int32).reshape(-1)
  return vocab_lib.encode_bytes(text.encode("utf-8"))


def encode_prompt(vocab: Any, text: str) -> np.ndarray:
  """A prompt's ids: as ``encode``, less an EOS the tokenizer puts after a
  text (``encode_prompt``)."""
  if hasattr(vocab, "encode_prompt"):
    return np.asarray(vocab.encode_prompt(text), np.int32)
  return encode(vocab, text)


def generation_model(model: Any, s: Any) -> Any:
  """``model`` with ``generate.mem_len`` (of the settings ``s``) where it
  carries memory."""
  mem_len = int(s.of(Generate).mem_len or s.model.mem_len)
  if model.carries_memory() and mem_len != model.cfg.mem_len:
    model = model.with_settings(mem_len=mem_len)
  return model


def _describe(g: Generate) -> str:
  """The token choice in words."""
  if g.greedy:
    return "greedy"
  top_k = f"top-k {int(g.top_k)}, " if g.top_k else ""
  return f"{top_k}top-p {float(g.top_p)}, temperature {float(g.temperature)}"


def generate(run: spec.Run) -> dict[str, Any]:
  """``--mode=generate``: continues the prompts (see module doc)."""
  g = run.settings.of(Generate)
  sampling = g.sampling()  # Bad settings: one line before the restore.
  if g.prompts:
    texts = read_prompts(g.prompts)
    return _from_file(run, g, sampling, texts)
  return _from_split(run, g, sampling)


def _from_split(
    run: spec.Run, g: Generate, sampling: sampling_lib.Sampling
) -> dict[str, Any]:
  """Continues the window of ``generate.split``; writes generation.txt and
  generation.json."""
  s, workdir = run.settings, run.workdir
  restored = restore.restore_source(run)
  reader = run_memory(restored) if g.memory else None
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
  model = generation_model(restored.model, s)
  seg = int(s.eval.segment_len or s.data.seq_len)
  memory = model.cfg.mem_len if model.carries_memory() else 0
  console.info(
      "generating %d tokens after a %d-token prompt (%s[%d:%d]), %s, "
      "segments of %d, memory %d",
      int(g.num_tokens),
      length,
      g.split,
      start,
      start + length,
      _describe(g),
      seg,
      memory,
  )
  vocab = restored.vocab
  new = _continue(restored, s, g, sampling, [prompt], reader)[0]
  prompt_text, new_text = decode(vocab, prompt), decode(vocab, new)
  header = (
      f"model {s.name}, step {restored.step}; prompt "
      f"{g.split}[{start}:{start + length}]; {int(g.num_tokens)} tokens, "
      f"{_describe(g)}, seed {int(g.seed)}, segments of {seg}, memory {memory}"
  )
  if reader is not None:
    header += f"; reading the {reader.kind} memory"
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


def _continue(
    restored: Any,
    s: Any,
    g: Generate,
    sampling: sampling_lib.Sampling,
    ids: Sequence[np.ndarray],
    reader: Optional[generation.MemoryReader],
) -> list[np.ndarray]:
  """``continue_prompts`` with the restored run's model (``generate.
  mem_len``), segments, windows and stop ids; says which context it
  reads."""
  model = generation_model(restored.model, s)
  return continue_prompts(
      model,
      restored.variables,
      ids,
      int(g.num_tokens),
      sampling,
      [int(g.seed) + i for i in range(len(ids))],
      stop_ids(restored.vocab),
      int(s.eval.segment_len or s.data.seq_len),
      batch_size=int(g.batch_size),
      reader=reader,
      windows=decode_windows.Windows.of(restored.scoring()),
      restored=restored,
      say=True,
  )


def _from_file(
    run: spec.Run,
    g: Generate,
    sampling: sampling_lib.Sampling,
    texts: Sequence[str],
) -> dict[str, Any]:
  """Continues every prompt of ``generate.prompts``, ``batch_size`` at a
  time; writes generations.jsonl."""
  s, workdir = run.settings, run.workdir
  restored = restore.restore_source(run)
  reader = run_memory(restored) if g.memory else None
  vocab = restored.vocab
  ids = [encode_prompt(vocab, t) for t in texts]
  empty = [n for n, x in enumerate(ids, 1) if not len(x)]
  if empty:
    raise errors.DataError(
        f"generate.prompts: prompt {empty[0]} of {g.prompts} encodes to no "
        "token; give each prompt some text"
    )
  console.info(
      "generating up to %d tokens after each of %d prompts (%s), %s",
      int(g.num_tokens),
      len(ids),
      g.prompts,
      _describe(g),
  )
  stops = stop_ids(vocab)
  new = _continue(restored, s, g, sampling, ids, reader)
  rows = []
  for i, (text, x, y) in enumerate(zip(texts, ids, new)):
    stopped = bool(len(y)) and int(y[-1]) in set(stops)
    rows.append(
        {
            "index": i,
            "prompt": text,
            "prompt_ids": x.tolist(),
            "continuation": decode(vocab, y),
            "ids": y.tolist(),
            "stop": "eos" if stopped else "length",
        }
    )
    print(f"=== {i}: {text}\n{rows[-1]['continuation']}\n", flush=True)
  out = paths.join(workdir, "generations.jsonl")
  paths.write_text(out, "".join(json.dumps(r) + "\n" for r in rows))
  return {"name": s.name, "step": restored.step, "rows": rows, "files": [out]}
