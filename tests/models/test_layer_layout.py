"""memjax.models.layer_layout: a stack's variables per layer or with its
runs stacked, on an optimiser state, abstract trees and partial targets;
the run names it parses are the ones ``stack.LayerRun`` gives."""

import jax
from jax.sharding import NamedSharding, PartitionSpec as P
import numpy as np
import optax

from memjax.models import layer_layout
from memjax.models import stack


def _layer(v):
  return {
      "attention": {"kernel": np.full((2, 3), v, np.float32)},
      "ln_attn": {"scale": np.full((3,), v, np.float32)},
  }


def test_run_names_round_trip_through_the_parser():
  run = stack.LayerRun("decoder", 4, 3, True)
  assert run.name == "decoder_4_to_6"
  assert layer_layout.parse_name(run.name) == ("decoder", 4, 6)
  alone = stack.LayerRun("layer", 3, 1, False)
  assert layer_layout.parse_name(alone.name) is None
  assert layer_layout.BLOCK_NAME.match(alone.name)


def test_an_optimiser_state_is_unstacked_where_it_holds_the_tree():
  plain = {f"layer_{i}": _layer(i) for i in range(4)}
  scanned = layer_layout.stack_layers(plain, ("layer_0_to_2",))
  np.testing.assert_array_equal(
      scanned["layer_0_to_2"]["ln_attn"]["scale"][:, 0], [0, 1, 2]
  )
  # Adam's moments hold the tree.
  adam = optax.adam(1e-3).init(scanned)
  assert layer_layout.stacked_blocks(adam) == ("layer_0_to_2",)
  assert "layer_2" in layer_layout.unstack_layers(adam)[0].mu


def test_abstract_leaves_get_an_unsharded_leading_axis():
  mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:2]), ("tensor",))
  spec = NamedSharding(mesh, P(None, "tensor"))
  sds = lambda: {
      "kernel": jax.ShapeDtypeStruct((4, 6), np.float32, sharding=spec)
  }
  abstract = {"layer_0": sds(), "layer_1": sds()}
  stacked = layer_layout.stack_layers(abstract, ("layer_0_to_1",))
  leaf = stacked["layer_0_to_1"]["kernel"]
  assert leaf.shape == (2, 4, 6)
  assert leaf.sharding.spec == P(None, None, "tensor")
  again = layer_layout.unstack_layers(stacked)["layer_1"]["kernel"]
  assert again.shape == (4, 6) and again.sharding.spec == P(None, "tensor")
  # A partial target (one layer lacks a leaf) stacks what any layer has.
  partial = {"layer_0": sds(), "layer_1": {}}
  assert layer_layout.stack_layers(partial, ("layer_0_to_1",))["layer_0_to_1"][
      "kernel"
  ].shape == (2, 4, 6)
