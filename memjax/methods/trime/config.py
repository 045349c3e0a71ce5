"""TRIME's config keys, added to ``memjax.config.base_config``.

The flat keys are those of the loss, data and evaluation-memory sections
(``--config.loss.memory``, ``--config.data.bm25_k``,
``--config.eval_memory.temperature``), so command lines name them as they
name the engine's.
"""

import ml_collections


def add_defaults(c: ml_collections.ConfigDict) -> None:
  """Adds TRIME's settings to the base config ``c``."""
  # bm25 batching (Algorithm 1): hits per query, the seed of the chain's
  # random starts, and English stop words dropped (word corpora).
  c.data.bm25_k = 20
  c.data.bm25_seed = 0
  c.data.bm25_stopwords = False
  # --mode=pack: '' packs in this process (bm25_order's .npy cache); a Beam
  # runner (DirectRunner, DataflowRunner, FlinkRunner, SparkRunner) writes
  # the packed SeqIO task's cache instead (pack_beam), with `workers` local
  # processes (DirectRunner) and `options` passed to Beam as flags, e.g.
  # '--project=p --region=r --temp_location=gs://b/tmp'.
  c.pack = ml_collections.ConfigDict()
  c.pack.runner = ""
  c.pack.workers = 2
  c.pack.options = ""
  # The TRIME objective (loss.name='trime'): its training memory (local |
  # long | external), the plain-LM warm-up share of the updates, the
  # probability of hiding the local memory (external), no gradient into the
  # memory keys (an ablation) and the keys per block of the blockwise loss.
  c.loss.memory = "local"
  c.loss.lm_warmup_fraction = 0.05
  c.loss.local_hide_prob = 0.9
  c.loss.stop_gradient_memory = False
  c.loss.block_size = 1024
  # Evaluation memory 'trime' (Eq. 6): tau divides the memory logits only.
  c.eval_memory.temperature = 1.0
  c.eval_memory.temperature_grid = (0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0)
  # --mode=memsweep (Figure 3): TRIME's memory against the cache.
  c.eval_memory.sweep_kinds = ("trime", "cache")
