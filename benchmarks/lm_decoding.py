"""Decoder-LM generation speed: recomputing the context for every token
against key/value-cache decoding.

    python benchmarks/lm_decoding.py [--prompt=256] [--new=64] \
        [--batches=1,8] [--d_model=384] [--layers=4] [--heads=6] \
        [--kv_heads=2] [--d_ff=1024] [--vocab=16000] [--rounds=2] [--out=FILE]

A randomly initialised Llama-shaped decoder LM (rotary positions, grouped
key/value heads, RMSNorm, a GLU feed-forward, untied embeddings) continues
``--batches`` random prompts of ``--prompt`` tokens by ``--new`` tokens
(top-p 0.95), by recomputing (``Recompute``, the baseline: each token one
forward pass over a [1, T] segment, T = prompt + new, prompt by prompt, as
generation ran before the cache) and with
``memjax.models.lm_decoding.CachedDecoder`` (the batch's prompts
prefilled in one call, then one cached step per token). Each method's
warm-up compiles it (the baseline's on a 2-token continuation, the
cache's on the timed length, which sizes its cache); the two
alternate within each round (the median round is reported). Prints one
JSON object with the machine, new tokens/s of each and the ratios; the
full-size setting is ``--d_model=1024 --layers=4 --heads=16 --kv_heads=4
--d_ff=2816 --vocab=32000 --prompt=768 --new=256`` (110.6M parameters,
45M of them in the layers).

``--config=configs/trime_wt103.py:trime_150m`` times a paper config's
model instead (randomly initialised, its corpus's published vocabulary as
``--mode=plan`` takes it; ``--vocab`` and the shape flags are then
unused): the TRIME 150M LM, 53M parameters with its adaptive softmax over
267,735 words; a recurrent config's model decodes with its own decoder
by segments of its ``data.seq_len`` (LaMemo's), without the baseline,
which would drop its memory. ``--baseline_batches=1`` times the baseline at batch 1
only: it runs the prompts one by one, so its batch-8 speed is its batch-1
speed.

``--workdir=W`` times a trained run's cached decoding without and with an
evaluation memory read at every step (``memjax.memory.generation``):
``--memory`` (a setting as JSON; '' = the run's), with ``--datastore``
attached for kNN-LM or TRIMELM_ext (``--ext_k``, ``--search``). The report
adds the datastore's queries (one per row and token) and the search's
milliseconds per query, e.g. over the kNN-LM demo's datastore::

    python benchmarks/lm_decoding.py --workdir=runs/extmem_demo/vanilla \
        --datastore=runs/extmem_demo/vanilla/datastore \
        --memory='{"kind": "knn", "knn_temperature": 1, "knn_lambda": 0.25}'
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top

from benchmarks import harness  # pylint: disable=g-import-not-at-top


class Recompute:
  """The baseline: each new token is one forward pass of the model over
  the prompt and the tokens so far, padded to ``length`` (one
  compilation), drawn from the last real position; prompt by prompt.

  Kept here, not in the library: key/value-cache decoding replaced it.
  """

  def __init__(self, model, length, sampling):
    # pylint: disable=g-import-not-at-top
    from memjax.models import variables as model_vars

    def log_probs(variables, x, n):
      def fn(mdl, x):
        h = mdl(x, None, None, deterministic=True).hidden
        last = jax.lax.dynamic_index_in_dim(h, n - 1, axis=1, keepdims=False)
        return mdl.log_probs(last)[0]

      return model.apply(model_vars.as_variables(variables), x, method=fn)

    self.length = int(length)
    self._log_probs = jax.jit(log_probs)
    self._choose = jax.jit(
        lambda lp, key: sampling.choose(lp[None], key[None])[0]
    )

  def generate(self, variables, prompt, new, seed):
    """[new] int32 tokens after ``prompt`` [n]."""
    x = np.zeros((1, self.length), np.int32)
    n = len(prompt)
    x[0, :n] = prompt
    key, out = jax.random.PRNGKey(seed), []
    for t in range(new):
      lp = self._log_probs(variables, x, np.int32(n))
      out.append(int(self._choose(lp, jax.random.fold_in(key, t))))
      x[0, n], n = out[-1], n + 1
    return np.asarray(out, np.int32)


class GenerateBench:
  """Times one generation method on a fixed batch of prompts."""

  def __init__(self, name, fn, prompts, new, warm_new=0):
    self.name, self.fn, self.prompts, self.new = name, fn, prompts, new
    self.warm_new = warm_new or new
    self.times: list[float] = []

  def warm_up(self, steps: int) -> None:
    # Compiles what ``new`` tokens run: the cached decoder's cache length
    # depends on it (``warm_new`` = ``new``); the baseline's segment does
    # not (2 tokens).
    for _ in range(steps):
      self.fn(self.prompts, self.warm_new)

  def run(self, steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
      out = self.fn(self.prompts, self.new)
      assert all(len(o) == self.new for o in out), "a row stopped early"
    return (time.perf_counter() - start) / steps


def _model(args):
  """(model, variables): a random Llama-shaped decoder LM."""
  # pylint: disable=g-import-not-at-top
  from memjax import build
  from memjax import settings
  from memjax.models import transformer

  cfg = settings.Model(
      num_layers=args.layers,
      d_model=args.d_model,
      num_heads=args.heads,
      head_dim=args.d_model // args.heads,
      d_ff=args.d_ff,
      cutoffs=(),
      scale_embedding=False,
      dropout=0.0,
      attention_dropout=0.0,
      feed_forward="glu",
      max_len=args.prompt + args.new,
      attention_options={"rope_theta": 10000.0, "num_kv_heads": args.kv_heads},
      family_options={
          "positions": "none",
          "norm": "rms",
          "tie_embeddings": False,
      },
  )
  model = transformer.decoder_lm(
      cfg, vocab_size=args.vocab, parts=build.parts()
  )
  x = np.zeros((1, 8), np.int32)
  variables = jax.jit(lambda k: model.init(k, x, deterministic=True))(
      jax.random.PRNGKey(0)
  )
  return model, variables


def _config_model(args):
  """(model, variables, vocabulary size, data.seq_len): ``--config``'s
  model, randomly initialised, its ``max_len`` at least prompt + new."""
  from memjax.modes import plan_compile  # pylint: disable=g-import-not-at-top

  config = harness.load_config(args.config)
  config.model.max_len = max(config.model.max_len, args.prompt + args.new)
  run = harness._build(config, mesh={"data": 1})  # pylint: disable=protected-access
  vocab = plan_compile.vocab_size(run.settings)
  model = run.model(vocab)
  x = np.zeros((1, 8), np.int32)
  variables = jax.jit(lambda k: model.init(k, x, deterministic=True))(
      jax.random.PRNGKey(0)
  )
  return model, variables, vocab, int(config.data.seq_len)


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  add = parser.add_argument
  for name, default in (
      ("prompt", 256),
      ("new", 64),
      ("d_model", 384),
      ("layers", 4),
      ("heads", 6),
      ("kv_heads", 2),
      ("d_ff", 1024),
      ("vocab", 16000),
  ):
    add(f"--{name}", type=int, default=default)
  add("--batches", default="1,8", help="comma-separated batch sizes")
  add(
      "--baseline_batches",
      default="",
      help="batch sizes the recomputing baseline is timed at ('' = --batches)",
  )
  add("--config", default="", help="a paper config's model instead")
  add(
      "--workdir",
      default="",
      help="a trained run: its cached decoding with and without --memory",
  )
  add("--datastore", default="", help="with --workdir: attach this datastore")
  add(
      "--memory",
      default="",
      help="with --workdir: the evaluation memory, as JSON ('' = the run's)",
  )
  add("--ext_k", type=int, default=0, help="neighbours (0 = the run's)")
  add("--search", default="scann", help="the datastore's search: scann|exact")
  harness.add_timing_args(parser, steps=1, warmup=1, rounds=2)
  return parser


def _batches(text: str) -> list[int]:
  return [int(x) for x in text.split(",") if x]


def _random_model_benches(args, rng) -> tuple[list, dict]:
  """The recomputing baseline and the cached decoder on a random model."""
  # pylint: disable=g-import-not-at-top
  from memjax.models import lm_decoding
  from memjax.models import sampling as sampling_lib

  segment_len = 0
  if args.config:
    model, variables, args.vocab, segment_len = _config_model(args)
  else:
    model, variables = _model(args)
  params = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(variables))
  harness.log(f"model: {params / 1e6:.1f}M parameters")
  sampling = sampling_lib.Sampling(top_p=0.95)
  baseline = Recompute(model, args.prompt + args.new, sampling)
  # A recurrent model's own decoder (LaMemo's), by segments of the
  # config's data.seq_len; the baseline would drop its memory, so it is
  # not timed for one.
  decoder = lm_decoding.decoder(model, segment_len=segment_len)
  if model.carries_memory():
    harness.log("a recurrent model: the recomputing baseline is not timed")

  def old(prompts, new):
    return [
        baseline.generate(variables, p, new, i) for i, p in enumerate(prompts)
    ]

  def cached(prompts, new):
    seeds = list(range(len(prompts)))
    return decoder.generate(variables, prompts, new, sampling, seeds)

  benches = []
  old_batches = _batches(args.baseline_batches or args.batches)
  if model.carries_memory():
    old_batches = []
  for b in _batches(args.batches):
    prompts = list(rng.integers(0, args.vocab, (b, args.prompt)))
    if b in old_batches:
      benches.append(
          GenerateBench(f"recompute batch {b}", old, prompts, args.new, 2)
      )
    benches.append(
        GenerateBench(f"cached batch {b}", cached, prompts, args.new)
    )
  model_name = args.config or "random Llama-shaped (the shape flags)"
  return benches, {"model": model_name, "parameters": params}


def _memory_benches(args, rng) -> tuple[list, dict]:
  """A trained run's cached decoding without and with its evaluation
  memory (``--memory``, e.g. kNN-LM over ``--datastore``)."""
  # pylint: disable=g-import-not-at-top
  import json

  import memjax
  from memjax.models import lm_decoding
  from memjax.models import sampling as sampling_lib
  from memjax.modes import generate as generate_lib

  lm = memjax.load(args.workdir)
  setting = json.loads(args.memory) if args.memory else None
  if args.datastore:
    more = {"ext_k": args.ext_k} if args.ext_k else {}
    lm.attach(args.datastore, setting, search=args.search, **more)
  setting = setting or lm.memory
  reader = generate_lib.memory_reader(lm.restored.scoring(), setting)
  model, variables = lm.restored.model, lm.restored.variables
  plain = lm_decoding.CachedDecoder(model)
  read = lm_decoding.CachedDecoder(model, reader)
  sampling = sampling_lib.Sampling(top_p=0.95)

  def run(decoder):
    def fn(prompts, new):
      seeds = list(range(len(prompts)))
      return decoder.generate(variables, prompts, new, sampling, seeds)

    return fn

  benches = []
  for b in _batches(args.batches):
    prompts = list(rng.integers(0, lm.restored.vocab_size, (b, args.prompt)))
    benches.append(
        GenerateBench(f"cached batch {b}", run(plain), prompts, args.new)
    )
    benches.append(
        GenerateBench(
            f"cached + {reader.kind} batch {b}", run(read), prompts, args.new
        )
    )
  search = reader.search
  extra = {"model": args.workdir, "memory": setting, "search": args.search}
  return benches, {**extra, "searcher": search}


def main() -> None:
  args = _parser().parse_args()
  rng = np.random.default_rng(0)
  if args.workdir:
    benches, extra = _memory_benches(args, rng)
  else:
    benches, extra = _random_model_benches(args, rng)
  search = extra.pop("searcher", None)
  harness.run_rounds(
      benches, rounds=args.rounds, steps=args.steps, warmup=args.warmup
  )
  results = []
  for bench in benches:
    s = harness.summarize(bench.times, len(bench.prompts) * args.new)
    results.append(
        {
            "name": bench.name,
            "new_tokens_per_s": s.get("tokens_per_s"),
            "seconds_per_pass_median": s.get("seconds_per_step_median"),
            "seconds_per_pass_all_rounds": s.get("seconds_per_step_all_rounds"),
        }
    )
  if search is not None:  # Warm-up and timed passes: one query a token.
    extra["search_queries"] = search.queries
    extra["search_ms_per_query"] = (
        1e3 * search.search_seconds / max(search.queries, 1)
    )
  harness.finish(
      results,
      args,
      ratio_keys=("new_tokens_per_s",),
      prompt_len=args.prompt,
      new_tokens=args.new,
      **extra,
  )


if __name__ == "__main__":
  main()
