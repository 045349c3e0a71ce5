"""The evaluation step ``--mode=plan`` compiles (``plan_eval``): its FLOPs
per position against the forward counted by hand and against the train
step's, the stream scorer's segment for a model that carries memory, and a
model with state of its own (a product-key memory's BatchNorm)."""

import importlib

import jax
import pytest

from memjax import build
from memjax.modes import plan
from memjax.modes import plan_compile
from memjax.modes import plan_eval


def _config(config_file: str, variant: str, **options):
  """A smoke config on the suite's eight devices, widened so that products
  outweigh the elementwise work XLA also counts (D 128, heads of 64, V 256
  without clusters, no dropout: see tests/modes/test_plan.py's _tiny)."""
  config = importlib.import_module(f"configs.{config_file}").get_config(variant)
  config.plan.devices = 8
  config.plan.vocab_size = 256
  m = config.model
  m.dropout = m.adaptive_dropout = m.attention_dropout = 0.0
  m.cutoffs, m.d_model, m.head_dim, m.d_ff = (), 128, 64, 256
  for k, v in options.items():
    m.feed_forward_options[k] = v
  return config


def test_eval_flops_per_position_are_the_forward_by_hand():
  run = build.build(_config("trime_wt103", "smoke"), "plan")
  c = run.settings
  step = plan_eval.build_eval_step(run, jax.devices())
  rows, length = plan_eval.eval_shape(step)
  # eval.batch_size windows (a multiple of the 8 devices) of window_len.
  assert (rows, length) == (16, c.eval.window_len)
  assert step.tokens == rows * length
  xla = plan_compile.step_flops(step)
  per_token = xla["flops"] / step.tokens
  # The forward by hand: 2 FLOPs per parameter and position (the tied
  # softmax's product; the input's embedding is a gather) and QK^T and AV
  # over the whole window, 2 x 2 T d_attn per layer.
  n = step.num_params
  d_attn = c.model.num_heads * c.model.head_dim
  by_hand = 2 * n + 4 * c.model.num_layers * length * d_attn
  assert 1.0 <= per_token / by_hand < 1.10, (per_token, by_hand)
  # The plan's forward formula is that count; each device runs its rows.
  train = plan_compile.build_step(run, jax.devices())
  assert plan.eval_formula(train, rows, length) == pytest.approx(by_hand)
  assert xla["repeated"] < 1.05 and xla["uncounted_loops"] == 0
  assert n == train.num_params


def test_eval_is_a_third_of_the_train_step_at_the_same_length():
  # Forward only: a third of forward and backward (1 + 2) per position, at
  # the train step's length (the optimiser's update and the loss's
  # elementwise work aside).
  config = _config("trime_wt103", "smoke")
  config.eval.window_len = config.data.seq_len
  run = build.build(config, "plan")
  train = plan_compile.build_step(run, jax.devices())
  step = plan_eval.build_eval_step(run, jax.devices())
  ratio = (
      plan_compile.step_flops(step, per_device=False)["flops"] / step.tokens
  ) / (plan_compile.step_flops(train, per_device=False)["flops"] / train.tokens)
  assert 0.30 < ratio < 0.37, ratio


def test_a_model_carrying_memory_is_planned_over_one_segment():
  # Transformer-XL: the stream scorer's scan over one segment of the lanes,
  # its memory of mem_len rows carried in and out.
  run = build.build(_config("txl_wt103", "smoke"), "plan")
  c = run.settings
  step = plan_eval.build_eval_step(run, jax.devices())
  _, memory, segment = step.args
  lanes = segment["inputs"].shape[1]
  assert lanes % 8 == 0 and lanes >= c.eval.lanes
  length = c.eval.segment_len or c.data.seq_len
  assert segment["inputs"].shape == (1, lanes, length)
  assert step.tokens == lanes * length
  assert jax.tree.leaves(memory)
  flops = plan_compile.step_flops(step)
  assert flops["uncounted_loops"] == 0
  memory_bytes = plan_compile.step_memory(step)
  assert memory_bytes["opt_state"] == 0 and memory_bytes["total"] > 0


def test_a_model_with_state_is_planned_with_it():
  # PKM-BERT's query BatchNorm keeps batch statistics, which the forward
  # reads: they are arguments of the step beside the parameters.
  run = build.build(
      _config("pkm_bert", "pkm_smoke", num_keys=32),
      "plan",
  )
  step = plan_eval.build_eval_step(run, jax.devices())
  variables = step.args[0]
  assert set(variables) == {"params", *run.state_collections()}
  assert (
      step.num_params == plan_compile.build_step(run, jax.devices()).num_params
  )
  assert plan_compile.step_flops(step)["flops"] > 0
