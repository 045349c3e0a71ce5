"""BERT-style encoders with product-key memory (configs/pkm_bert.py).

Masking, the encoder's attention and padding, partial initialisation, the
frozen-memory switch, the classification metric, Figure 4's KL and IOU,
bad TSV input, and the pretrain -> fine-tune chain on the 2-step runs that
tests/shared_runs.py trains in process (shared with colabs/pkm_bert.ipynb):
partial initialisation from the MLM run, the fine-tune's results, and a
resume that keeps the best dev parameters.
"""

import csv
import json
import os
import shutil

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import pkm_bert
import memjax
from memjax import build
from memjax import dispatch
from memjax.checkpoints import checkpointing
from memjax import errors
from memjax import losses
from memjax.run import init_from
from memjax.run import step as step_lib
from memjax.methods.pkm import class_usage
from memjax.tasks import config as task_config
from memjax.tasks.classification import accuracy
from memjax.data import glue
from memjax.data import mlm
from memjax.models import encoder
from tests.models import helpers

MEM = dict(num_keys=4, heads=2, topk=2, k_dim=8)


def _tiny(**kw):
  args = dict(
      num_layers=2,
      d_model=16,
      num_heads=2,
      head_dim=8,
      d_ff=32,
      feed_forward="resm",
      feed_forward_options=MEM,
      feed_forward_layers=(2,),
      max_len=16,
      norm_position="post",
      norm_epsilon=1e-12,
  )
  args.update(kw)
  return encoder.Encoder(cfg=helpers.config(40, **args))


# -- masking -----------------------------------------------------------------


def test_masking_proportions_and_specials():
  rng = np.random.default_rng(0)
  tokens = rng.integers(5, 1000, size=(200, 128)).astype(np.int32)
  tokens[:, 0] = 3  # [CLS]
  tokens[:20, 64:] = 0  # padding
  tokens[:, 10] = 1  # EOS
  b = mlm.mask_tokens(tokens, rng, mask_id=4, first_ordinary=5, vocab_size=1000)
  chosen = b["weights"] > 0
  ordinary = tokens >= 5
  assert not np.any(chosen & ~ordinary)  # never pad, EOS, [CLS]
  assert abs(chosen.sum() / ordinary.sum() - 0.15) < 0.005
  masked = chosen & (b["inputs"] == 4)
  kept = chosen & (b["inputs"] == tokens)
  rand = chosen & ~masked & ~kept
  n = chosen.sum()
  assert abs(masked.sum() / n - 0.8) < 0.015
  assert abs(kept.sum() / n - 0.1) < 0.012  # (+ random draws of itself)
  assert abs(rand.sum() / n - 0.1) < 0.012
  np.testing.assert_array_equal(b["inputs"][~chosen], tokens[~chosen])
  np.testing.assert_array_equal(b["targets"], tokens)


def test_unmasked_positions_carry_no_loss():
  m = _tiny()
  rng = np.random.default_rng(1)
  tokens = rng.integers(5, 40, size=(4, 12)).astype(np.int32)
  b = mlm.mask_tokens(
      tokens, rng, mask_id=4, first_ordinary=5, vocab_size=40, mask_prob=0.3
  )
  init = jax.jit(m.init)  # Far cheaper than running init op by op.
  params = init(jax.random.PRNGKey(0), b["inputs"], b["targets"])["params"]

  @jax.jit  # One program for the model and the loss (not op by op).
  def loss(targets):
    out = m.apply({"params": params}, b["inputs"], targets)
    batch = dict(b, targets=targets)
    return losses.lm_loss(out, batch, step=0, rng=None)[0], out

  base, out = loss(b["targets"])
  w = b["weights"] > 0
  expect = -np.asarray(out.target_logprob)[w].mean()
  np.testing.assert_allclose(float(base), expect, rtol=1e-6)
  other = np.where(w, b["targets"], (b["targets"] + 7) % 40)
  np.testing.assert_allclose(float(loss(other)[0]), float(base), rtol=1e-7)


# -- encoder -------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["vanilla", "rpe"])
def test_encoder_attends_both_ways_and_ignores_padding(kind):
  m = _tiny(attention=kind)
  x = jnp.array([[3, 7, 9, 11, 13, 15]], jnp.int32)
  params = jax.jit(m.init)(jax.random.PRNGKey(0), x)["params"]
  hid = jax.jit(lambda t: m.apply({"params": params}, t, method=m.encode)[0])
  h = hid(x)
  later = hid(x.at[0, 5].set(20))  # a later token changes an earlier output
  earlier = hid(x.at[0, 0].set(20))  # and an earlier one a later output
  assert not np.allclose(h[0, 1], later[0, 1])
  assert not np.allclose(h[0, 5], earlier[0, 5])
  padded = jnp.concatenate([x, jnp.zeros((1, 6), jnp.int32)], axis=1)
  pair = jnp.concatenate(
      [padded, jnp.array([[3, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8]], jnp.int32)]
  )
  np.testing.assert_allclose(hid(padded)[0, :6], h[0], atol=1e-5)
  np.testing.assert_allclose(hid(pair)[0, :6], h[0], atol=1e-5)
  # Padding in front moves the tokens: only relative positions ignore it.
  moved = hid(jnp.concatenate([jnp.zeros((1, 6), jnp.int32), x], axis=1))
  same = np.allclose(moved[0, 6:], h[0], atol=1e-5)
  assert same == (kind == "rpe")


# -- metrics -----------------------------------------------------------------


def test_accuracy_hand_made():
  logits = np.array([[2.0, 1.0], [0.1, 0.3], [5.0, -1.0], [0.0, 1.0]])
  assert accuracy(logits, np.array([0, 1, 1, 0])) == 0.5
  assert accuracy(logits, np.array([0, 1, 0, 1])) == 1.0


def test_class_usage_iou_and_kl_hand_made():
  pos = np.array([2.0, 2.0, 0.0, 0.0])
  neg = np.array([0.0, 2.0, 2.0, 0.0])
  assert class_usage.iou(pos, neg) == pytest.approx(2.0 / 6.0)
  assert class_usage.iou(pos, pos) == 1.0
  assert class_usage.kl(pos, pos) == pytest.approx(0.0, abs=1e-9)
  # P = (.5, .5, f, f), Q = (f, .5, .5, f) up to the floor f = 1e-10:
  # KL = .5 log(.5 / f) + .5 log(1) + f log(f / .5) + 0.
  f = class_usage.FLOOR
  expect = 0.5 * np.log(0.5 / f) + f * np.log(f / 0.5)
  assert class_usage.kl(pos, neg) == pytest.approx(expect, rel=1e-6)
  both = class_usage.compare({"l": pos}, {"l": neg})
  assert set(both["l"]) == {"kl", "iou"}


# -- bad input ------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, message",
    [
        ("it is good\t1\n", "header"),
        ("sentence\tlabel\nfine film\t2\n", "not one of"),
        ("sentence\tlabel\n \t1\n", "empty sentence"),
    ],
)
def test_bad_tsv(tmp_path, text, message):
  path = tmp_path / "train.tsv"
  path.write_text(text)
  with pytest.raises(errors.DataError, match=message):
    glue.read_tsv(str(path), ("0", "1"))


def test_init_from_sharing_nothing_is_refused():
  with pytest.raises(errors.CheckpointMismatchError, match="shares no"):
    checkpointing.source_paths({"a/kernel": 1}, {"b/kernel": (2,)}, (), "r")


# -- frozen memory -------------------------------------------------------------


def test_frozen_memory_is_bit_identical(tmp_path):
  config = pkm_bert.get_config("cls_resm_frozen_smoke")
  run = build.build(config, str(tmp_path))
  model = run.model(50)
  x = jnp.ones((2, 8), jnp.int32)
  params = flax.core.meta.unbox(
      jax.jit(model.init)(jax.random.PRNGKey(0), x, x)["params"]
  )
  tx, _ = run.optimizer(10)
  opt = jax.jit(tx.init)(params)

  @jax.jit
  def step(p, opt, key):
    keys = iter(jax.random.split(key, len(jax.tree.leaves(p))))
    grads = jax.tree.map(lambda a: jax.random.normal(next(keys), a.shape), p)
    updates, opt = tx.update(grads, opt, p)
    return jax.tree.map(lambda a, u: a + u, p, updates), opt

  p = params
  for i in range(3):
    p, opt = step(p, opt, jax.random.PRNGKey(i))
  flat0 = flax.traverse_util.flatten_dict(params, sep="/")
  flat1 = flax.traverse_util.flatten_dict(p, sep="/")
  frozen = [k for k in flat0 if k.endswith(("memory/values", "memory/keys"))]
  assert len(frozen) == 4
  for k in frozen:
    np.testing.assert_array_equal(np.asarray(flat1[k]), np.asarray(flat0[k]))
  assert not np.array_equal(flat1["pooler/kernel"], flat0["pooler/kernel"])
  assert not np.array_equal(
      flat1["layer_1/ffn/memory/query/kernel"],
      flat0["layer_1/ffn/memory/query/kernel"],
  )


# -- the two-stage chain -------------------------------------------------------
# One 2-step MLM run and one 2-step fine-tune of it (tests/shared_runs.py), shared
# with the notebook test.


def test_partial_init_restores_every_shared_parameter(
    bert_mlm_smoke_workdir, capsys, tmp_path
):
  vanilla_run = bert_mlm_smoke_workdir
  config = pkm_bert.get_config("init_resm_smoke")
  config.train.init_from = vanilla_run
  source = dispatch.restore(vanilla_run, mesh={"data": 1})
  run = build.build(config, str(tmp_path))
  model = run.model(source.vocab_size)
  tx, _ = run.optimizer()
  sample = {"inputs": np.zeros((16, 32), np.int32)}
  state, shardings = step_lib.create_state(
      model,
      tx,
      run.mesh,
      sample,
      jax.random.PRNGKey(7),
      run.state_collections(),
  )
  capsys.readouterr()
  new = init_from.init_params_from(run, vanilla_run, state, shardings)
  printed = capsys.readouterr().out
  s = flax.traverse_util.flatten_dict(jax.device_get(source.params), sep="/")
  n = flax.traverse_util.flatten_dict(jax.device_get(new.params), sep="/")
  fresh = flax.traverse_util.flatten_dict(jax.device_get(state.params), sep="/")
  for k, v in n.items():
    source_key = k.replace("ffn/dense/", "ffn/")  # init_resm's map
    if source_key in s:
      np.testing.assert_array_equal(v, s[source_key], err_msg=k)
    else:
      assert "/memory/" in k, k
      np.testing.assert_array_equal(v, fresh[k])
      assert k in printed
  assert "layer_1/ffn/dense/wi/kernel" in n  # ResM's FFN came from the FFN
  assert "not used: none" in printed


def _scores_and_usage(restored, ids):
  """(class logits [N, C], {layer: {'reads', 'top1', 'weights'} [K]}) of
  the encoded sentences ``ids`` in one batch, straight from the model (not
  through the run's scorer and batching)."""
  inputs = np.zeros((len(ids), max(len(x) for x in ids)), np.int32)
  for i, x in enumerate(ids):
    inputs[i, : len(x)] = x
  model = restored.model
  out, sown = jax.jit(
      lambda v, x: model.apply(
          v, x, None, True, method=model.forward, mutable=["pkm_usage"]
      )
  )(restored.variables, inputs)
  flat = flax.traverse_util.flatten_dict(sown["pkm_usage"], sep="/")
  usage = {}
  for key, value in flat.items():
    layer, name = key.rsplit("/", 1)
    usage.setdefault(layer, {})[name] = np.asarray(value, np.float64)
  return np.asarray(out.logits), usage


def test_finetune_reports_accuracy_and_class_usage(bert_cls_smoke_workdir):
  """The reported test accuracy, class IOU and KL and memory usage,
  recomputed with NumPy from the best dev checkpoint's scores and sown
  counts."""
  with open(os.path.join(bert_cls_smoke_workdir, "results.json")) as f:
    res = json.load(f)
  assert res["best_step"] in (1, 2)
  best = dispatch.restore(
      os.path.join(bert_cls_smoke_workdir, "best_dev"), mesh={"data": 1}
  )
  assert best.step == res["best_step"]
  c = best.settings.of(task_config.Classification)
  vocab = mlm.load_vocabulary(os.path.join(bert_cls_smoke_workdir, "spm.model"))
  cls_id, _ = mlm.special_ids(vocab)

  def read(split):
    path = os.path.join(glue.DEFAULT_DIR, f"{split}.tsv")
    with open(path, encoding="utf-8") as f:
      rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    labels = np.array([list(c.labels).index(r["label"]) for r in rows])
    ex = glue.encode_examples(
        [r["sentence"] for r in rows], labels, vocab, cls_id, c.max_len
    )
    return ex.ids, labels

  ids, labels = read("test")
  logits, _ = _scores_and_usage(best, ids)
  assert res["test"]["accuracy"] == pytest.approx(
      np.mean(logits.argmax(-1) == labels), abs=1e-12
  )
  ids, labels = read("dev")  # classification.usage_split
  _, usage = _scores_and_usage(best, ids)
  by_class = [
      _scores_and_usage(best, [ids[i] for i in np.flatnonzero(labels == k)])[1]
      for k in (1, 0)
  ]
  layers = res["class_divergence"]
  assert (
      sorted(layers)
      == sorted(usage)
      == [
          "layer_0/ffn/memory",
          "layer_1/ffn/memory",
      ]
  )
  for layer, d in layers.items():
    pos, neg = (u[layer]["top1"] for u in by_class)
    np.testing.assert_allclose(
        d["iou"], np.minimum(pos, neg).sum() / np.maximum(pos, neg).sum()
    )
    # KL of the normalised counts, each slot floored at 1e-10 first (a slot
    # one class never picks would make it infinite), then renormalised.
    p, q = (np.maximum(t / t.sum(), 1e-10) for t in (pos, neg))
    p, q = p / p.sum(), q / q.sum()
    np.testing.assert_allclose(d["kl"], np.sum(p * np.log(p / q)), rtol=1e-6)
    m, u = res["memory"][layer], usage[layer]
    assert m["reads"] == u["reads"].sum()
    assert m["mu"] == np.mean(u["reads"] > 0)
    assert m["top1_mu"] == np.mean(u["top1"] > 0)
    r = u["reads"] / u["reads"].sum()
    # float32 sums in the model against float64 here: 1e-4.
    np.testing.assert_allclose(
        m["kl_u"], np.log(len(r)) + np.sum(r * np.log(r)), rtol=1e-4
    )


def test_resumed_finetune_keeps_the_best_dev_parameters(
    bert_cls_smoke_workdir, tmp_path
):
  """A run resumed after its last step scores test at the best dev step.

  The fixture's best dev step is kept in ``best_dev``; a run that forgot it
  on resume would choose among the dev scores after the resume only.
  """
  run = bert_cls_smoke_workdir
  with open(os.path.join(run, "results.json")) as f:
    first = json.load(f)
  best = dispatch.restore(os.path.join(run, "best_dev"), mesh={"data": 1})
  assert best.step == first["best_step"]
  final = dispatch.restore(run, mesh={"data": 1})
  if best.step != final.step:
    leaves = zip(jax.tree.leaves(best.params), jax.tree.leaves(final.params))
    assert any(not np.array_equal(a, b) for a, b in leaves)
  workdir = tmp_path / "resumed"
  shutil.copytree(run, workdir)
  os.remove(workdir / "results.json")
  res = memjax.train(dispatch.saved_config(run), str(workdir))
  for key in ("best_step", "dev", "test", "class_divergence", "memory"):
    assert res[key] == first[key], key
