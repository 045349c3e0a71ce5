"""memjax.checkpoints.convert: what earlier versions saved, read as today's.

The signatures compared are the ones the earlier code wrote into the
fixture exports of every model family (tests/fixtures/families/*, version
2, and version 3 for the later Transformer-XL and relative-position ones):
upgraded, each must equal the signature today's code computes from the
same run's saved config. The renames are checked on hand-written trees,
including an optimiser state that holds the parameter tree twice.
"""

import glob
import json
import os

import numpy as np
import optax
import pytest

from memjax import build
from memjax import config as config_lib
from memjax.checkpoints import convert
from memjax.models import layer_layout
from tests.conftest import REPO

FIXTURES = sorted(
    glob.glob(os.path.join(REPO, "tests", "fixtures", "families", "*"))
)


def _saved(fixture):
  with open(os.path.join(fixture, "export", "export.json")) as f:
    return json.load(f)["signature"]


@pytest.mark.parametrize("fixture", FIXTURES, ids=os.path.basename)
def test_an_earlier_signature_upgrades_to_the_one_computed_today(fixture):
  saved = _saved(fixture)
  assert saved["signature_version"] in (2, 3)
  with open(os.path.join(fixture, "run", "config.json")) as f:
    config = config_lib.from_json(f.read())
  run = build.build(config, "unused")
  today = run.signature(saved["model"]["vocab_size"])
  assert today["signature_version"] == convert.VERSION == 3
  assert convert.upgrade(saved) == today
  if saved["signature_version"] == 3:
    assert saved == today
    return
  # What version 2 left out at its first value, version 3 holds.
  left_out = set(convert.LATER_MODEL_KEYS) - set(saved["model"])
  assert left_out and left_out <= set(today["model"])


def test_upgrade_keeps_other_versions_and_drops_runtime_options():
  v1 = {"model": {"d_model": 16}, "name": "x"}
  assert convert.upgrade(v1) == v1
  v3 = {"model": {"d_model": 16}, "name": "x", "signature_version": 3}
  assert convert.upgrade(v3) == v3
  v2 = {
      "model": {
          "d_model": 16,
          "feed_forward": "pkm",
          "feed_forward_options": {
              "allow_batchnorm_future_leak": False,
              "k": 4,
          },
      },
      "name": "x",
      "signature_version": 2,
  }
  up = convert.upgrade(v2)
  assert up["signature_version"] == 3
  assert up["model"]["feed_forward"] == "pkm"
  assert up["model"]["feed_forward_options"] == {"k": 4}
  assert up["model"]["family"] == "decoder_lm"
  assert up["model"]["activation"] == "relu"
  assert v2["model"]["feed_forward_options"]["k"] == 4  # Not changed.


def _sig(family, version):
  return {"model": {"family": family}, "signature_version": version}


def test_the_layout_of_each_family_and_version():
  assert convert.Layout.of(_sig("decoder_lm", 2)).current
  assert convert.Layout.of(_sig("marge", 2)).current
  assert convert.Layout.of(_sig("encoder_decoder", 3)).current
  assert convert.Layout.of({"model": {}}).current  # Version 1.
  seq2seq = convert.Layout.of(_sig("encoder_decoder", 2))
  assert seq2seq.renames == {
      "self_attention": "attention",
      "ln_self": "ln_attn",
  }
  encoder = convert.Layout.of(_sig("encoder", 2))
  assert encoder.renames == {"ln_attention": "ln_attn"}


def _leaf(v):
  return np.full((2,), v, np.float32)


def test_renames_apply_under_blocks_only_and_round_trip():
  layout = convert.Layout.of(_sig("encoder_decoder", 2))
  saved = {
      "encoder_0": {
          "self_attention": {"query": {"kernel": _leaf(1)}},
          "ln_self": {"scale": _leaf(2)},
          "ffn": {"wi": {"kernel": _leaf(3)}},
      },
      "decoder_1": {
          "self_attention": {"query": {"kernel": _leaf(4)}},
          "cross_attention": {"query": {"kernel": _leaf(5)}},
      },
      # Not a block: names here are not sub-layers and stay.
      "embedder": {"self_attention": _leaf(6)},
  }
  current = layout.to_current(saved)
  assert set(current["encoder_0"]) == {"attention", "ln_attn", "ffn"}
  assert set(current["decoder_1"]) == {"attention", "cross_attention"}
  assert set(current["embedder"]) == {"self_attention"}
  np.testing.assert_array_equal(
      current["decoder_1"]["attention"]["query"]["kernel"], _leaf(4)
  )
  back = layout.to_saved(current)
  assert set(back["encoder_0"]) == {"self_attention", "ln_self", "ffn"}
  assert set(back["decoder_1"]) == {"self_attention", "cross_attention"}
  assert convert.CURRENT.to_current(saved) is saved
  assert layout.path_to_current("decoder_1/self_attention/query/kernel") == (
      "decoder_1/attention/query/kernel"
  )
  assert layout.path_to_current("embedder/self_attention") == (
      "embedder/self_attention"
  )
  assert layout.shapes_to_current({"encoder_0/ln_self/scale": (16,)}) == {
      "encoder_0/ln_attn/scale": (16,)
  }


def test_renames_reach_the_parameters_inside_an_optimiser_state():
  layout = convert.Layout.of(_sig("encoder", 2))
  params = {"layer_0": {"ln_attention": {"scale": np.ones(3, np.float32)}}}
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3))
  state = tx.init(params)
  current = layout.to_current(state)
  adam = current[1][0]
  assert type(adam) is type(state[1][0])  # The named tuple is kept.
  assert set(adam.mu["layer_0"]) == {"ln_attn"}
  assert set(adam.nu["layer_0"]) == {"ln_attn"}
  # The converted state still drives an update of today's tree.
  today = layout.to_current(params)
  grads = {"layer_0": {"ln_attn": {"scale": np.ones(3, np.float32)}}}
  updates, _ = tx.update(grads, current, today)
  assert updates["layer_0"]["ln_attn"]["scale"].shape == (3,)


def test_scanned_layers_stack_and_unstack_both_ways():
  import jax  # pylint: disable=g-import-not-at-top

  layer = lambda v: {
      "attention": {"kernel": np.full((2, 3), v, np.float32)},
      "ln_attn": {"scale": np.full((3,), v, np.float32)},
  }
  plain = {f"layer_{i}": layer(i) for i in range(4)}
  plain["embedder"] = {"embed_0": np.zeros((5, 3), np.float32)}
  to_scanned = convert.Layout(current_runs=("layer_0_to_2",))
  scanned = to_scanned.to_current(plain)
  assert sorted(scanned) == ["embedder", "layer_0_to_2", "layer_3"]
  np.testing.assert_array_equal(
      scanned["layer_0_to_2"]["ln_attn"]["scale"][:, 0], [0, 1, 2]
  )
  assert layer_layout.stacked_blocks(scanned) == ("layer_0_to_2",)
  # And back.
  back = convert.Layout(saved_runs=("layer_0_to_2",)).to_current(scanned)
  assert sorted(back) == sorted(plain)
  for k in plain:
    for a, b in zip(jax.tree.leaves(plain[k]), jax.tree.leaves(back[k])):
      np.testing.assert_array_equal(a, b)
  # Shapes by path, as init_from reads a checkpoint's.
  shapes = {"layer_0_to_2/ln_attn/scale": (3, 16), "embedder/e": (5, 16)}
  layout = convert.Layout(saved_runs=("layer_0_to_2",))
  assert layout.shapes_to_current(shapes) == {
      "layer_0/ln_attn/scale": (16,),
      "layer_1/ln_attn/scale": (16,),
      "layer_2/ln_attn/scale": (16,),
      "embedder/e": (5, 16),
  }
  into = layout.into({"layer_1_to_2": {}})
  assert into.shapes_to_current(shapes) == {
      "layer_0/ln_attn/scale": (16,),
      "layer_1_to_2/ln_attn/scale": (2, 16),
      "embedder/e": (5, 16),
  }
