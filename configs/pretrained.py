"""Pretrained causal LMs imported from a local Hugging Face folder.

Usage: ``--config=configs/pretrained.py:import --config.pretrained.path=DIR
--workdir=W --mode=import`` (docs/pretrained.md). The model's sizes and
options come from DIR's config.json at import, and a config given later
for W (or for a run whose ``train.init_from`` is W) takes them from W's
export (``memjax/pretrained/sizes.py``), so a variant names what is done
with the model, not its sizes:

* ``import``: the plain model (no memory), scored with windows of 512
  tokens of which the last 256 are scored (cut to the model's positions
  when it has fewer), on WikiText-103's raw text (``wikitext103_raw``;
  ``--config.data.corpus=text`` reads any ``{train,valid,test}.txt``)
  through the imported tokenizer.
* ``gpt2_knn``: kNN-LM (Khandelwal et al. 2020) on the imported model, as
  knn-transformers runs it on GPT-2: a datastore of (g, next token) over
  the training split (``--mode=datastore``; g the last block's
  feed-forward input, knn-transformers' ``last_ffn_input``), a ScaNN index
  by squared L2 (``--mode=index``), and p = 0.25 p_kNN + 0.75 p_LM over
  K = 1024 neighbours, temperature 1 (``--mode=memeval``; ``--mode=tune``
  tries the lambda grid).
* ``gpt2_trime``: TRIMELM_long (Zhong et al. 2022) continued from an
  import: ``--config.train.init_from=W`` (the import's workdir) in a new
  workdir trains with TRIME's objective over the local and long-term
  in-batch memories (blocks of m = 4 consecutive segments of 512 tokens,
  cut to the model's positions), on WikiText-103's raw text through W's
  tokenizer, learning rate 5e-5 with 100 warm-up steps, 2,000 steps, the
  checkpoint's dropout 0.1; then ``--mode=memeval`` scores with
  M_local u M_long (4,096 long-term tokens; ``--mode=tune`` tries 0, 2,048
  and 4,096 and the temperature).
* ``llama_pkm``: a product-key memory (Lample et al. 2019) inserted into
  an imported model as Kim & Jung's residual memory (ResM: FFN + PKM,
  ``model.feed_forward='resm'``) at the second-to-last layer
  (``feed_forward_layers=(-2,)``, counted from the end), trained from
  ``--config.train.init_from=W``. Initialised as Kim & Jung initialise
  PKM-BERT from BERT: every parameter of the memory-less model is
  restored, the memory layer's FFN from that layer's FFN
  (``init_from_map``: ``layer_i/ffn/dense/`` <- ``layer_i/ffn/``; Llama's
  SwiGLU kept, ``feed_forward_options.base='glu'``), the memory's queries
  and keys fresh; its values start at zero (``zero_values``), so at
  initialisation the model computes exactly what the imported one does.
  512^2 slots, 4 heads, top 32, k_dim 256, LayerNorm queries (causal).
* ``llama_pkm_replace``: Lample et al.'s own placement, the memory in
  place of that layer's feed-forward (``model.feed_forward='pkm'``). Every
  other parameter of the imported model is restored; the replaced FFN's
  are reported as not used; the memory starts as Lample et al. initialise
  it (random values), so unlike ``llama_pkm`` the model does not start as
  the import.

``--mode=plan`` (docs/plan.md) sizes a variant against the hardware before
the weights are fetched: ``--config.pretrained.path=DIR`` with DIR holding
the model's ``config.json`` alone. What it proposes for Llama-3-8B
(``tests/fixtures/pretrained/llama3_8b_config``; float32 parameters and
Adam state, ``--config.model.dtype=bfloat16``,
``--config.model.scan_layers=True``; the default mesh puts a full copy of
the parameters and optimiser state on every device):

* ``gpt2_knn`` evaluation and datastore on one H100: as configured (32.9
  GiB of 55.9 usable).
* ``gpt2_trime`` on 8 H100s: ``--config.data.batch_size=32`` (whole lanes
  per device) ``--config.mesh.data=1 --config.mesh.fsdp=8
  --config.model.remat=True --config.model.remat_policy=dots_no_batch``
  (36.5 GiB per device; 212 as configured).
* ``gpt2_trime`` on TPU v5e: a ``v5litepod-8`` (16 GiB chips) does not
  hold it; a ``v5litepod-16`` does with ``--config.data.batch_size=64
  --config.mesh.data=1 --config.mesh.fsdp=16 --config.model.remat=True
  --config.model.remat_policy=full`` (10.6 GiB per chip). Evaluation on a
  ``v5litepod-8``: ``--config.mesh.data=1 --config.mesh.fsdp=8`` (5.7 GiB
  per chip).
* With ``--config.model.param_dtype=bfloat16`` (bfloat16 weights, float32
  Adam moments) ``gpt2_trime`` fits a ``v5litepod-8``:
  ``--config.data.batch_size=32 --config.mesh.data=1 --config.mesh.fsdp=8
  --config.model.remat=True --config.model.remat_policy=full`` (13.6 GiB
  per chip); evaluation on one H100 holds 15.0 GiB of weights instead of
  29.9.
"""

from memjax import config as base
from memjax import errors

VARIANTS = (
    "import",
    "gpt2_knn",
    "gpt2_trime",
    "llama_pkm",
    "llama_pkm_replace",
)


def _import():
  c = base.base_config()
  c.name = "pretrained"
  c.model.cutoffs = ()
  c.model.scale_embedding = False
  c.model.dropout = 0.0
  c.eval.window_len = 512
  c.eval.score_len = 256
  c.eval.batch_size = 4
  # Raw text through the imported tokenizer (memjax.data.text_streams):
  # the shipped demo copy unless data.data_dir names the release's.
  c.data.corpus = "wikitext103_raw"
  return c


def _knn(c):
  """kNN-LM with knn-transformers' GPT-2 settings (k 1024, lambda 0.25,
  temperature 1)."""
  c.name = "pretrained_knn"
  em = c.eval_memory
  em.kind = "knn"
  em.ext_k = 1024
  c.external.knn_lambda = 0.25
  c.external.knn_temperature = 1.0
  em.batch_size = 4
  c.datastore.split = "train"
  return c


def _trime(c):
  """TRIMELM_long's objective, batching and evaluation memories."""
  c.name = "pretrained_trime"
  c.model.dropout = 0.1  # GPT-2's resid_pdrop and embd_pdrop.
  c.loss.name = "trime"
  c.trime.memory = "long"
  c.data.batching = "blocks"
  c.data.segments_per_lane = 4
  c.data.seq_len, c.data.batch_size = 512, 8
  c.optim.learning_rate, c.optim.warmup_steps = 5e-5, 100
  c.optim.schedule = "cosine"
  c.train.num_steps, c.train.log_every = 2000, 50
  c.train.eval_every, c.train.checkpoint_every = 500, 500
  em = c.eval_memory
  em.kind = "trime"
  em.long_mem_tokens = 4096
  em.long_mem_grid = (0, 2048, 4096)
  em.batch_size = 4
  return c


def _pkm(c):
  """ResM inserted at one layer, initialised from the memory-less model."""
  c.name = "pretrained_pkm"
  m = base.use_kinds(c, feed_forward="resm").model  # Every option filled in.
  m.feed_forward_layers = (-2,)  # From the end; sizes.py resolves it.
  o = m.feed_forward_options
  o.num_keys, o.heads, o.topk, o.k_dim = 512, 4, 32, 256
  o.query_norm = "layer"
  o.zero_values = True
  c.train.init_from_map = (r"^(layer_\d+/ffn)/dense/=\1/",)
  c.data.seq_len, c.data.batch_size = 512, 8
  c.optim.learning_rate, c.optim.warmup_steps = 1e-4, 100
  c.train.num_steps, c.train.log_every = 2000, 50
  c.train.eval_every, c.train.checkpoint_every = 500, 500
  return c


def get_config(arg: str = "import"):
  if arg not in VARIANTS:
    raise errors.ConfigError(
        f"unknown config variant {arg!r} of configs/pretrained.py; pick one of "
        f"{', '.join(VARIANTS)}"
    )
  c = _import()
  if arg == "gpt2_knn":
    c = _knn(c)
  elif arg == "gpt2_trime":
    c = _trime(c)
  elif arg == "llama_pkm":
    c = _pkm(c)
  elif arg == "llama_pkm_replace":
    c = _pkm(c)
    base.use_kinds(c, feed_forward="pkm")
    c.model.feed_forward_options.zero_values = False
    c.train.init_from_map = ()
  return c
