"""``--mode=plan``: the 7m model's parameters counted from an initialised
model, its FLOPs per token against the textbook formula, FLOPs per step that
double with the micro-batches, TPU slice shapes, the device flags set
before JAX starts, a run of the mode through ``memjax.main`` that
writes nothing but the plan, a pretrained model planned from its
config.json alone, and a step the device's compiler refuses for want of
memory."""

import dataclasses
import importlib
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import trime_wt103
from configs import txl_wt103
from memjax import build
from memjax import errors
from memjax import extend
from memjax.modes import plan
from memjax.modes import plan_compile
from memjax.modes import platforms
from tests.conftest import REPO
from tests.conftest import run_main


def _count(tree) -> int:
  return sum(int(np.size(x)) for x in jax.tree.leaves(tree))


def test_7m_parameters_and_flops_per_token(tmp_path):
  config = trime_wt103.get_config("7m")
  config.plan.devices = 8  # the suite's eight fake CPU devices
  run = build.build(config, str(tmp_path))
  step = plan_compile.build_step(run, jax.devices())
  # An initialised model, counted leaf by leaf.
  model = run.model(267_737)
  tokens = jnp.zeros((1, 8), jnp.int32)
  params = model.init(
      {"params": jax.random.PRNGKey(0)}, tokens, tokens, deterministic=True
  )["params"]
  n = _count(params)
  assert step.num_params == n
  assert 7.0e6 < n < 7.2e6
  # 6 N + 12 n_layer T d_attn (PaLM App. B), plus the forward pass of the
  # adaptive softmax that its chunked scoring recomputes (2 N_softmax).
  layers, t, d_attn = 8, 3072, 4 * 32
  formula = 6 * n + 12 * layers * t * d_attn + 2 * _count(params["embedder"])
  flops = plan_compile.step_flops(step)
  per_token = flops["flops"] / (8 * 3072)
  assert abs(per_token / formula - 1) < 0.10, (per_token, formula)
  # XLA's rule, each loop body once, sees one of the softmax's 6 chunks.
  assert flops["flops_loops_once"] < 0.8 * flops["flops"]
  # Each device scores its own rows, the adaptive softmax's chunks
  # included: no work is repeated (4.27 when the chunks flattened the
  # batch away and every device scored every chunk).
  assert flops["repeated"] <= 1.05, flops


def test_repeated_counts_work_every_device_does():
  # One program, two placements on the suite's eight devices: the rows
  # split over the devices (each computes its share), then gathered onto
  # every device before the same product (each computes all of it).
  from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top

  mesh = jax.sharding.Mesh(np.asarray(jax.devices()), ("data",))
  rows, whole = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
  x = jax.ShapeDtypeStruct((64, 256), jnp.float32, sharding=rows)
  w = jax.ShapeDtypeStruct((256, 256), jnp.float32, sharding=whole)

  def product(keep_rows: bool):
    def f(x, w):
      if not keep_rows:
        x = jax.lax.with_sharding_constraint(x, whole)
      return jnp.tanh(x @ w) @ w

    return lambda: jax.jit(f, out_shardings=rows if keep_rows else whole)

  def ratio(keep_rows: bool) -> float:
    lowered = product(keep_rows)().lower(x, w)
    return plan_compile.repeated(
        plan_compile.device_flops(lowered.compile()).total(),
        8,
        plan_compile.program_flops(lowered).total(),
    )

  assert ratio(True) == pytest.approx(1.0, abs=0.05)
  assert ratio(False) == pytest.approx(8.0, rel=0.05)


def _smoke(batch_size: int, grad_accum: int):
  c = trime_wt103.get_config("smoke")
  c.plan.devices = 8
  c.data.batch_size, c.train.grad_accum = batch_size, grad_accum
  return plan_compile.build_step(build.build(c, "plan"), jax.devices())


def test_doubling_grad_accum_doubles_flops_per_step():
  # The same micro-batch of 8 segments, 2 then 4 times per step.
  two = plan_compile.step_flops(_smoke(16, 2), per_device=False)
  four = plan_compile.step_flops(_smoke(32, 4), per_device=False)
  assert four["flops"] / two["flops"] == pytest.approx(2.0, rel=0.01)
  # Counting each loop body once sees one micro-batch either way.
  assert four["flops_loops_once"] / two["flops_loops_once"] < 1.1


def _settings(config):
  """The typed settings of ``config`` (what runs before JAX starts)."""
  return build.read(config, build.parts())


def test_tpu_slices_and_device_flags():
  v4, v5e = platforms.get("tpu_v4"), platforms.get("tpu_v5e")
  assert platforms.topology_name(v4, 4) == "v4:2x2x1"
  assert platforms.topology_name(v4, 256) == "v4:4x8x8"
  assert platforms.topology_name(v5e, 8) == "v5e:2x4"
  assert platforms.topology_name(v4, 6, "1x2x3") == "v4:1x2x3"
  with pytest.raises(errors.ConfigError, match="plan.tpu_shape"):
    platforms.topology_name(v4, 6)
  with pytest.raises(errors.ConfigError, match="h100"):
    platforms.get("tpu_v9")
  config = trime_wt103.get_config("smoke")
  config.plan.devices, config.plan.platform = 16, "h100"
  env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8 --foo"}
  platforms.set_device_flags(_settings(config), env)
  assert env["XLA_FLAGS"].split() == [
      "--foo",
      "--xla_force_host_platform_device_count=16",
  ]
  assert env["JAX_PLATFORMS"] == "cpu"
  # Cloud TPU names: v4 and v5p count TensorCores, v5e chips.
  config.plan.devices = 0
  for name, platform, chips in (
      ("v4-8", "tpu_v4", 4),
      ("v5litepod-8", "tpu_v5e", 8),
      ("v5p-128", "tpu_v5p", 64),
  ):
    config.plan.platform = name
    assert platforms.get(name).name == platform
    assert platforms.planned_devices(_settings(config)) == chips
    assert f"{chips} {platform} chips" in platforms.describe(_settings(config))
  config.plan.platform, config.plan.tpu_shape = "v4-8", "2x2x1"
  assert platforms.planned_devices(_settings(config)) == 4
  for devices, shape, match in (
      (8, "", "contradicts"),
      (0, "2x2x2", "is 8 chips"),
      (0, "2by2", "joined by 'x'"),
  ):
    config.plan.devices, config.plan.tpu_shape = devices, shape
    with pytest.raises(errors.ConfigError, match=match):
      platforms.planned_devices(_settings(config))
  with pytest.raises(errors.ConfigError, match="per chip"):
    platforms.get("v4-3")
  config.plan.platform, config.plan.devices = "h100", 16
  with pytest.raises(errors.ConfigError, match="for TPU platforms"):
    platforms.planned_devices(_settings(config))
  config.plan.tpu_shape = ""
  # Default: the devices the mesh names.
  config.plan.devices = 0
  config.mesh.fsdp, config.mesh.tensor = 2, 2
  assert platforms.planned_devices(_settings(config)) == 4


@pytest.mark.newest
def test_main_plans_without_data_or_checkpoints(tmp_path):
  workdir = str(tmp_path / "plan")
  # Started with one device: --config.plan.devices=4 must reach XLA.
  r = run_main(
      "--config=configs/trime_wt103.py:smoke",
      f"--workdir={workdir}",
      "--mode=plan",
      "--config.plan.devices=4",
      "--config.plan.platform=h100",
      "--config.data.data_dir=/nonexistent",
      "--config.plan.dtypes=('bfloat16',)",
      devices=1,
  )
  assert r.returncode == 0, r.stderr[-2000:]
  assert sorted(os.listdir(workdir)) == ["plan.json", "plan.md"]
  with open(os.path.join(workdir, "plan.json")) as f:
    plan = json.load(f)
  assert plan["devices"] == 4 and plan["mesh"]["data"] == 4
  assert plan["estimate"] is True
  assert list(plan["dtypes"]) == ["bfloat16"]
  assert plan["dtypes"]["bfloat16"]["max_micro_batch"] % 4 == 0
  assert "| 4x h100 (est.) | bfloat16 |" in r.stdout
  bad = run_main(
      "--config=configs/trime_wt103.py:smoke",
      f"--workdir={workdir}2",
      "--mode=plan",
      "--config.plan.platform=tpu_v9",
  )
  assert bad.returncode == 2
  assert bad.stderr.strip().splitlines()[-1].startswith("memjax: error: ")
  assert not os.path.exists(f"{workdir}2")


def test_main_plans_a_method_run_with_its_formula_terms(tmp_path):
  # MARGE's declared terms (memjax/methods/marge/flops.py) reach plan.json
  # through python -m memjax.main --mode=plan, and the counted FLOPs are
  # above the formula without them.
  workdir = str(tmp_path / "plan")
  r = run_main(
      "--config=configs/marge_wt103.py:smoke",
      f"--workdir={workdir}",
      "--mode=plan",
      "--config.plan.devices=2",
      "--config.plan.fit_batch=False",
      "--config.plan.dtypes=('float32',)",
      devices=1,
  )
  assert r.returncode == 0, r.stderr[-2000:]
  with open(os.path.join(workdir, "plan.json")) as f:
    plan = json.load(f)
  terms = plan["formula_flops_per_token"]["terms"]
  assert set(terms) == {"cross-attention", "sources through the lower half"}
  assert all(v > 0 for v in terms.values())
  assert plan["flops"]["uncounted_loops"] == 0
  assert "| wt103_marge_smoke | 2x cpu | float32 |" in r.stdout


def _tiny(config, **options):
  """A smoke config widened so that products outweigh the elementwise
  work XLA also counts (D 128, heads of 64, V 256 without clusters), and
  without dropout, whose random bits (threefry's loop of 5 rounds over
  every activation, counted 5 times by ``hlo_flops``) weigh as much as a
  product at this width but are no part of the formula."""
  config.plan.devices = 8
  config.plan.vocab_size = 256
  m = config.model
  m.dropout = m.adaptive_dropout = m.attention_dropout = 0.0
  m.cutoffs, m.d_model, m.head_dim, m.d_ff = (), 128, 64, 256
  for k, v in options.items():
    m.feed_forward_options[k] = v
  return plan_compile.build_step(build.build(config, "plan"), jax.devices())


@pytest.mark.parametrize(
    "config_file, variant, options",
    [
        ("txl_wt103", "smoke", {}),
        ("lamemo_wt103", "smoke", {}),
        ("marge_wt103", "smoke", {}),
        ("pkm_bert", "pkm_smoke", {"num_keys": 32}),
    ],
)
def test_xla_counts_what_the_formula_counts(config_file, variant, options):
  # XLA's count of the unrolled step within 1.10x of the formula with the
  # methods' terms (memjax/methods/*/flops.py), and not without them.
  module = importlib.import_module(f"configs.{config_file}")
  step = _tiny(module.get_config(variant), **options)
  formula = plan.step_formula(step)
  xla = plan_compile.step_flops(step, per_device=False)["flops"] / step.tokens
  assert formula["terms"]
  assert 1.0 <= xla / formula["with_recompute"] < 1.10, (xla, formula)
  assert not 0.9 < xla / formula["before"] < 1.10, (xla, formula)


def test_formula_counts_softmax_padding_and_input_projections():
  # Transformer-XL base's softmax: 64 rows of 150 positions, scored at most
  # 4096 tokens (64 positions of each row) at a time: 3 chunks of 50, no
  # padding, each chunk recomputed in the backward pass.
  s = _settings(txl_wt103.get_config("base"))
  shape = extend.FlopsShape(
      seq_len=150,
      rows=64,
      num_params=1000,
      softmax_params=600,
      projection_params=100,
  )
  assert plan.softmax_positions(s, shape) == (150, True)
  f = plan.formula_flops(s, shape)
  attn = 12 * 16 * 300 * 410
  assert f["model"] == 6 * 1000 + attn + 6 * 100
  recomputed = 2 * 600  # Nothing padded: the chunks' forward pass again.
  assert f["with_recompute"] == pytest.approx(f["model"] + recomputed)
  # 151 positions: 3 chunks of 51, one padded position in each.
  odd = dataclasses.replace(shape, seq_len=151)
  assert plan.softmax_positions(s, odd) == (153, True)
  assert f["before"] == 6 * 1000 + attn + 2 * 600
  # One chunk holds 8 rows of 150: nothing padded or recomputed.
  small = dataclasses.replace(shape, rows=8)
  assert plan.softmax_positions(s, small) == (150, False)
  # With model.remat each term is recomputed once more (a third of it).
  term = lambda *_: {"t": 300.0}
  r = plan.formula_flops(
      _settings(trime_wt103.get_config("247m")), small, (term,)
  )
  plain = plan.formula_flops(_settings(trime_wt103.get_config("247m")), small)
  assert r["model"] - plain["model"] == 300
  assert r["with_recompute"] - plain["with_recompute"] == pytest.approx(400)
  # 247m's 16 blocks are recomputed but for their last product, the
  # feed-forward's 4096 x 1024 output projection; T = 150 + 0 here.
  big = dataclasses.replace(
      small, num_params=10**9, softmax_params=10**8, projection_params=0
  )
  f = plan.formula_flops(_settings(trime_wt103.get_config("247m")), big)
  attn = 12 * 16 * 150 * 8 * 128
  layers = 10**9 - 10**8 - 16 * 4096 * 1024
  assert f["with_recompute"] - f["model"] == 2 * layers + attn / 3


def test_xla_counts_the_encoder_decoders_rpe_terms():
  # The encoder-decoder with relative positions: what 'rpe' adds to XLA's
  # count is what its terms (memjax/methods/recurrent/flops.py) add to the
  # formula, within 5% (1.018 on trime_iwslt smoke, widened as _tiny does).
  xla, formula = {}, {}
  for kind in ("vanilla", "rpe"):
    config = importlib.import_module("configs.trime_iwslt").get_config("smoke")
    config.model.attention = kind
    step = _tiny(config)
    formula[kind] = plan.step_formula(step)
    flops = plan_compile.step_flops(step, per_device=False)["flops"]
    xla[kind] = flops / step.tokens
  assert "relative positions" in formula["rpe"]["terms"]
  added = (
      formula["rpe"]["with_recompute"] - formula["vanilla"]["with_recompute"]
  )
  assert added > 0
  assert 0.95 < (xla["rpe"] - xla["vanilla"]) / added < 1.05, (xla, formula)


def _plan_json(workdir, *flags):
  """plan.json of ``--mode=plan`` on one fake device (float32, no second
  compile), run through ``memjax.main``."""
  r = run_main(
      "--config=configs/pretrained.py:import",
      f"--workdir={workdir}",
      "--mode=plan",
      "--config.plan.devices=1",
      "--config.plan.fit_batch=False",
      "--config.plan.dtypes=('float32',)",
      *flags,
  )
  assert r.returncode == 0, r.stderr[-2000:]
  with open(os.path.join(workdir, "plan.json")) as f:
    return json.load(f)


def test_main_plans_a_pretrained_model_from_its_config_json_alone(tmp_path):
  # The tiny Llama's config.json alone (no weights, no tokenizer) plans the
  # model the import of its whole folder plans: the same parameters,
  # vocabulary and FLOPs of both steps.
  fixture = os.path.join(REPO, "tests", "fixtures", "pretrained", "llama_gqa")
  folder = tmp_path / "config_only"
  folder.mkdir()
  shutil.copy(os.path.join(fixture, "config.json"), folder)
  alone = _plan_json(
      str(tmp_path / "alone"), f"--config.pretrained.path={folder}"
  )
  imported = str(tmp_path / "imported")
  r = run_main(
      "--config=configs/pretrained.py:import",
      f"--config.pretrained.path={fixture}",
      f"--workdir={imported}",
      "--mode=import",
  )
  assert r.returncode == 0, r.stderr[-2000:]
  after = _plan_json(imported)
  # 2 layers of D 32, 4 heads (2 KV) of 8, SwiGLU 48, V 64, untied: by hand.
  d, v, f, kv = 32, 64, 48, 2 * 8
  layer = d * 32 + 2 * d * kv + 32 * d + 3 * d * f + 2 * d
  assert alone["num_params"] == 2 * layer + 2 * v * d + d == 19_616
  assert alone["vocab_size"] == after["vocab_size"] == 64
  assert alone["num_params"] == after["num_params"]
  assert alone["flops"]["flops"] == after["flops"]["flops"]
  got, want = (
      p["dtypes"]["float32"]["eval"]["flops"]["flops"] for p in (alone, after)
  )
  assert got == want > 0


def _refused(message: str):
  """The smoke step, its compilation refused with ``message``."""
  step = _smoke(16, 2)
  text = step.lowered().as_text(dialect="hlo")

  class Refused:

    def compile(self):
      raise jax.errors.JaxRuntimeError(message)

    def as_text(self, dialect=None):
      del dialect
      return text

  step._lowered = Refused()  # pylint: disable=protected-access
  return step


def test_a_step_the_device_compiler_refuses_is_planned_as_not_fitting():
  # libtpu refuses to compile a step that needs more memory than a chip
  # has (RESOURCE_EXHAUSTED); the plan reports the temporaries it names
  # beside the state, and the whole program's even share of the FLOPs.
  message = (
      "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory "
      "required for HLO temporaries (157.89G) exceeds available HBM "
      "(15.75G)."
  )
  step = _refused(message)
  memory = plan_compile.step_memory(step)
  state = sum(step.state_bytes.values())
  assert memory["temporaries"] == pytest.approx(157.89 * 2**30)
  assert memory["total"] == pytest.approx(state + 157.89 * 2**30)
  assert memory["out_of_memory"] == message
  flops = plan_compile.step_flops(step)
  assert flops["flops_per_device"] == pytest.approx(flops["flops"] / 8)
  assert "repeated" not in flops and flops["out_of_memory"] == message
  # Another runtime error is a bug, its traceback kept.
  with pytest.raises(jax.errors.JaxRuntimeError, match="INTERNAL"):
    plan_compile.step_memory(_refused("INTERNAL: something else"))
