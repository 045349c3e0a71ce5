"""The external memories' config keys, added to ``memjax.config.base_config``.

kNN-LM and TRIMELM_ext read a datastore of (g, next token) built by
``--mode=datastore`` (its settings: the ``datastore`` section) and searched
with the ScaNN index of ``--mode=index`` or exactly (the engine's
``eval_memory.datastore``, ``search``, ``ext_k``...).
"""

import ml_collections


def add_defaults(c: ml_collections.ConfigDict) -> None:
  """Adds the external memories' settings to the base config ``c``."""
  em = c.eval_memory
  em.external_kind = ""  # the method's kind with M_ext (demos)
  # tau' of Eq. 8 (trime_ext) in the authors' units: P' ~ exp(g . g_j / tau'),
  # the raw inner product (no sqrt(d)), as their --interp-temp 10.5.
  em.ext_temperature = 10.5
  em.ext_lambda = 0.3  # lambda of Eq. 9 (trime_ext); 0 = Eq. 6
  # The set P' runs over: 0 = the K external neighbours (the authors' code,
  # knnlm.py:139), 1 = all of M_eval, local, long and external (Eq. 8's text).
  em.ext_interp_local = 0.0
  em.ext_temperature_grid = (2.5, 5.0, 10.5, 20.0, 40.0, 80.0)
  em.ext_lambda_grid = (0.0, 0.1, 0.2, 0.3, 0.5)
  em.ext_interp_local_grid = ()  # () = ext_interp_local only
  em.knn_temperature = 1.0  # kNN-LM: none, as in Khandelwal et al.
  em.knn_lambda = 0.25  # kNN-LM interpolation weight
  em.knn_temperature_grid = (1.0,)
  em.knn_lambda_grid = (0.05, 0.1, 0.15, 0.25, 0.35, 0.5)

  # --mode=datastore: (g, next token) of a split, in shards.
  c.datastore = ml_collections.ConfigDict()
  c.datastore.split = "train"  # train | valid | test
  # Build from another corpus, read with the run's vocabulary (Table 5).
  c.datastore.corpus = ""  # "" = data.corpus
  c.datastore.data_dir = ""  # "" = datastore.corpus's demo copy
  c.datastore.shard_keys = 1_000_000  # about this many keys per shard
  c.datastore.batch_size = 0  # windows per batch; 0 = eval_memory.batch_size
  c.datastore.max_windows = 0  # only the first this many windows (0 = all)
  # k of n: this process writes shards s % n == k. Separate jobs set them;
  # the default 0 of 1 writes every shard (every process of a multi-host
  # job in step, as the features run on the global mesh); -1 / 0 take
  # jax.process_index() / jax.process_count().
  c.datastore.process_index = 0
  c.datastore.process_count = 1
  # --mode=index / recall: ScaNN per shard (0 = sqrt(n) leaves, 1/10 searched).
  c.datastore.leaves = 0
  c.datastore.reorder = 0  # candidates re-ordered exactly; 0 = max(2k, 256)
  c.datastore.recall_queries = 1000  # held-out (valid) queries of --mode=recall
  # --mode=recall also measures recall and time per query with each of these
  # numbers of leaves searched (a recall-speed curve), and writes the exact
  # neighbours of this many of its queries (token ids) to recall.json.
  c.datastore.recall_leaves = ()
  c.datastore.recall_examples = 0
