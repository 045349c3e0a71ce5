"""Scanned layers (``model.scan_layers``) compute what unscanned ones do.

The family fixtures (``tests/fixtures/families``: a run and an export of
each model family, trained unscanned, with a batch and the outputs on it)
restore into the scanned model, their layers stacked on the way, and
give the same outputs; gradients, a recurrent memory carried across
segments and a decoder's incremental decoding agree too, and the layouts
convert both ways.
"""

import os

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from memjax import build

from memjax import dispatch
from memjax import config as config_lib
from memjax.checkpoints import convert
from memjax.checkpoints import runfiles
from memjax.models import layer_layout
from memjax.models import stack
from tests.models import test_family_fixtures as fixtures

make_family_fixtures = fixtures.make_family_fixtures


def _scanned_config(root: str):
  files = runfiles.find(os.path.join(root, "run"))
  config = config_lib.from_json(runfiles.read_config_text(files))
  with config.unlocked():
    config.model.scan_layers = True
  return config


def _stacked(tree) -> list[str]:
  return sorted(k for k in tree if layer_layout.parse_name(k))


def test_runs_of_identical_layers():
  plain, pkm = "ffn", "pkm"
  keys = [plain] * 3 + [pkm] + [plain] * 3 + [pkm] + [plain] * 4
  names = [r.name for r in stack.runs("layer", keys, True)]
  assert names == [
      "layer_0_to_2",
      "layer_3",
      "layer_4_to_6",
      "layer_7",
      "layer_8_to_11",
  ]
  assert [r.name for r in stack.runs("layer", keys, False)] == [
      f"layer_{i}" for i in range(12)
  ]
  # A break starts a run (MARGE's embedder and decoder halves).
  halves = stack.runs("layer", [plain] * 4, True, breaks=(2,))
  assert [r.name for r in halves] == ["layer_0_to_1", "layer_2_to_3"]


# The family fixtures whose layers form a run of identical layers.
STACKED = (
    "decoder_lamemo",
    "decoder_xl",
    "decoder_rpe",
    "encoder_mlm",
    "encoder_classifier",
)


@pytest.mark.parametrize("family", fixtures.FAMILIES)
def test_fixtures_restore_scanned_with_the_same_outputs(family):
  root = os.path.join(fixtures.FIXTURES, "families", family)
  batch = dict(np.load(os.path.join(root, "batch.npz")))
  want = dict(np.load(os.path.join(root, "outputs.npz")))
  config = _scanned_config(root)
  for kind in ("run", "export"):
    restored = dispatch.restore(os.path.join(root, kind), config=config)
    runs = [r.name for r in restored.model.layer_runs() if r.scanned]
    assert _stacked(restored.params) == runs
    # Stacked where the fixture has runs (the relative-attention LMs' and
    # the encoders' two layers; the others' layers differ or stand alone).
    assert bool(runs) == (family in STACKED)
    got = _outputs(family, restored.model, restored.variables, batch)
    assert sorted(got) == sorted(want)
    for key, value in want.items():
      np.testing.assert_allclose(
          got[key], value, rtol=0, atol=1e-5, err_msg=f"{kind} {key}"
      )


# Each family deepened so that runs of identical layers form: (keys set on
# the fixture's model config).
DEEPER = {
    # Rematerialised, keeping the matmuls without batch dimensions.
    "decoder_pkm": {
        "num_layers": 5,
        "feed_forward_layers": (3,),
        "remat": True,
        "remat_policy": "dots_no_batch",
    },
    "decoder_lamemo": {"num_layers": 3},
    "encoder_decoder": {
        "num_layers": 3,
        "family_options": {"encoder_layers": 2},
    },
    "encoder_mlm": {"num_layers": 4, "feed_forward_layers": (2,)},
    "marge": {"num_layers": 4},
}


def _models(family: str, tmp_path, **model):
  """(unscanned, scanned) models of the deepened fixture config (and the
  model keys ``model``), and the fixture's batch."""
  root = os.path.join(fixtures.FIXTURES, "families", family)
  config = _scanned_config(root)
  with config.unlocked():
    for key, value in dict(DEEPER[family], **model).items():
      if key == "family_options":
        config.model.family_options.update(value)
      else:
        setattr(config.model, key, value)
  scanned = build.build(config, str(tmp_path / "s"))
  config.model.scan_layers = False
  plain = build.build(config, str(tmp_path / "u"))
  vocab = dispatch.restore(os.path.join(root, "export")).model.cfg.vocab_size
  batch = dict(np.load(os.path.join(root, "batch.npz")))
  return plain.model(vocab), scanned.model(vocab), plain, batch


def _outputs(family, model, variables, batch):
  """The model's float outputs on ``batch``, from one jitted program."""
  fn = jax.jit(
      lambda v: make_family_fixtures.model_outputs(family, model, v, batch)
  )
  return make_family_fixtures.floats(fn(variables))


def _sum_logprob(family, model, params, state, batch):
  from memjax.run import step as step_lib  # pylint: disable=g-import-not-at-top

  variables = step_lib.variables_of(params, state)
  outs = make_family_fixtures.model_outputs(family, model, variables, batch)
  return sum(jnp.sum(o.target_logprob) for o in outs.values())


def _init(model, run):
  """The model's (params, state) init as one compiled program, not one per
  operation."""
  from memjax.run import step as step_lib  # pylint: disable=g-import-not-at-top

  return jax.jit(
      lambda key: flax.core.meta.unbox(
          step_lib._init_variables(  # pylint: disable=protected-access
              model, run.state_collections(), 8, key
          )
      )
  )


@pytest.mark.parametrize("family", sorted(DEEPER))
def test_scanned_equals_unscanned(family, tmp_path):
  plain, scanned, run, batch = _models(family, tmp_path)
  from memjax.run import step as step_lib  # pylint: disable=g-import-not-at-top

  init = lambda model: _init(model, run)  # noqa: E731
  params, state = init(plain)(jax.random.PRNGKey(3))
  runs = tuple(r.name for r in scanned.layer_runs() if r.scanned)
  assert runs
  to_scanned = convert.Layout(current_runs=runs)
  to_plain = convert.Layout(saved_runs=runs)
  s_params, s_state = to_scanned.to_current((params, state))
  # The stacked tree is the scanned model's own.
  fresh = jax.eval_shape(init(scanned), jax.random.PRNGKey(3))
  shapes = lambda t: jax.tree.map(lambda x: x.shape, t)
  assert shapes((s_params, s_state)) == shapes(fresh)
  # Outputs (and the LaMemo memory carried to the next segment).
  want = _outputs(family, plain, step_lib.variables_of(params, state), batch)
  got = _outputs(
      family, scanned, step_lib.variables_of(s_params, s_state), batch
  )
  assert sorted(got) == sorted(want)
  for key in want:
    np.testing.assert_allclose(got[key], want[key], atol=1e-5, err_msg=key)
  # Gradients, stacked back into one entry per layer.
  grad = lambda model: jax.jit(
      jax.grad(lambda p, s: _sum_logprob(family, model, p, s, batch))
  )
  g_plain = grad(plain)(params, state)
  g_scanned = to_plain.to_current(grad(scanned)(s_params, s_state))
  flat_p = flax.traverse_util.flatten_dict(g_plain, sep="/")
  flat_s = flax.traverse_util.flatten_dict(g_scanned, sep="/")
  assert sorted(flat_p) == sorted(flat_s)
  for key, value in flat_p.items():
    np.testing.assert_allclose(
        flat_s[key], value, rtol=1e-4, atol=1e-5, err_msg=key
    )


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize(
    "policy,kept",
    [
        ("full", set()),
        ("probs", {stack.ATTENTION_PROBS}),
        ("probs_ffn", {stack.ATTENTION_PROBS, stack.FFN_HIDDEN}),
    ],
)
def test_named_policies_keep_the_named_residuals(policy, kept, dtype):
  """An attention and a feed-forward sub-layer under ``jax.checkpoint``
  with each policy: the residuals kept are the named ones, the attention
  probabilities in the compute dtype, and the gradient is the
  unrematerialised one."""
  from jax._src import ad_checkpoint  # pylint: disable=g-import-not-at-top
  from memjax.models import feed_forward  # pylint: disable=g-import-not-at-top
  from memjax.models import multihead  # pylint: disable=g-import-not-at-top

  attn = multihead.MultiHeadAttention(
      d_model=8, num_heads=2, head_dim=4, dtype=dtype
  )
  ffn = feed_forward.FeedForward(d_model=8, d_ff=12, dtype=dtype)
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 5, 8))
  pa = flax.core.meta.unbox(
      attn.init(jax.random.PRNGKey(1), x, deterministic=True, causal=True)
  )
  pf = flax.core.meta.unbox(
      ffn.init(jax.random.PRNGKey(2), x, deterministic=True)
  )

  def block(x, pa, pf):
    y, _ = attn.apply(pa, x, deterministic=True, causal=True)
    out = ffn.apply(pf, x + y, deterministic=True).astype(jnp.float32)
    return jnp.sum(out**2)

  remat = jax.checkpoint(block, policy=stack.remat_policy(policy))
  saved = ad_checkpoint.saved_residuals(remat, x, pa, pf)
  names = {
      n
      for n in (stack.ATTENTION_PROBS, stack.FFN_HIDDEN)
      for _, s in saved
      if f"'{n}'" in s
  }
  assert names == kept
  for aval, source in saved:
    if f"'{stack.ATTENTION_PROBS}'" in source:
      assert aval.shape == (2, 2, 5, 5) and aval.dtype == dtype
  grads = lambda f: jax.grad(f, argnums=(0, 1, 2))(x, pa, pf)
  jax.tree.map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6),
      grads(remat),
      grads(block),
  )


# Kernels a layer applies twice, whose two bfloat16 gradients the narrowed
# scan adds in bfloat16 where the layer's own casts add them in float32:
# LaMemo's position keys (the look-ahead and the segment's scores).
TWICE = ("decoder_lamemo", "/attention/pos_key/kernel")


@pytest.mark.parametrize("family", sorted(DEEPER))
def test_narrowed_kernels_give_the_same_gradients_in_bfloat16(
    family, tmp_path, monkeypatch
):
  """A bfloat16 model's scanned blocks read their kernels already cast to
  bfloat16 (``stack.narrow_kernels``, so that the scan stacks their
  gradients in bfloat16): every gradient is bit for bit the one the
  layers' own casts give, except a kernel used twice in a layer, whose two
  terms are added in bfloat16 (within bfloat16's rounding)."""
  _, scanned, run, batch = _models(family, tmp_path, dtype="bfloat16")
  params, state = _init(scanned, run)(jax.random.PRNGKey(3))

  def grads():
    fn = lambda p, s: _sum_logprob(family, scanned, p, s, batch)  # noqa: E731
    g = jax.jit(jax.grad(fn))(params, state)
    return flax.traverse_util.flatten_dict(g, sep="/")

  got = grads()
  monkeypatch.setattr(stack, "narrow_kernels", lambda tree, dtype: tree)
  want = grads()
  assert sorted(got) == sorted(want)
  for key, value in want.items():
    assert got[key].dtype == value.dtype == jnp.float32, key
    if family == TWICE[0] and key.endswith(TWICE[1]):
      scale = np.abs(value).max()
      np.testing.assert_allclose(got[key], value, atol=scale * 2**-8)
    else:
      np.testing.assert_array_equal(got[key], value, err_msg=key)


def test_narrow_kernels_casts_kernels_only_boxed_or_not():
  tree = {
      "attention": {
          "query": {"kernel": nn.Partitioned(jnp.ones((2, 3)), ("a", "b"))},
          "u": jnp.ones((2,)),
      },
      "ffn": {"wi": {"kernel": jnp.ones((3, 4)), "bias": jnp.ones((4,))}},
      "steps": jnp.ones((2,), jnp.int32),
  }
  got = stack.narrow_kernels(tree, jnp.bfloat16)
  dtypes = flax.traverse_util.flatten_dict(
      nn.meta.unbox(jax.tree.map(lambda x: x.dtype, got)), sep="/"
  )
  assert dtypes == {
      "attention/query/kernel": jnp.bfloat16,
      "attention/u": jnp.float32,
      "ffn/wi/kernel": jnp.bfloat16,
      "ffn/wi/bias": jnp.float32,
      "steps": jnp.int32,
  }
  assert isinstance(got["attention"]["query"]["kernel"], nn.Partitioned)
