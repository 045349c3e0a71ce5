"""Product-key memory LMs end to end: usage logged in training, the
memory_usage mode over held-out data, and bad memory settings."""

import json
import math
import os

import flax
import matplotlib.image
import numpy as np
import pytest

import memjax

from configs import pkm_wt103
from memjax import build
from memjax import dispatch
from memjax import errors
from memjax.data import corpus as corpus_lib

LAYERS = ("layer_0/ffn/memory", "layer_1/ffn/memory")
METRICS = ("mu", "top1_mu", "kl_u", "kl_w")


def _in_range(m, slots):
  assert 0 < m["top1_mu"] <= m["mu"] <= 1
  assert 0 <= m["kl_u"] <= math.log(slots) + 1e-5
  assert 0 <= m["kl_w"] <= math.log(slots) + 1e-5


def test_training_logs_usage_per_memory_layer(resm_smoke_workdir):
  with open(os.path.join(resm_smoke_workdir, "train_log.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  aux = rows[-1]["aux"]
  assert set(aux) == {f"{layer}/{m}" for layer in LAYERS for m in METRICS}
  for layer in LAYERS:
    _in_range({m: aux[f"{layer}/{m}"] for m in METRICS}, 16**2)


def test_memory_usage_mode_over_held_out_data(resm_smoke_workdir, tmp_path):
  config = pkm_wt103.get_config("resm_smoke")
  config.train.init_from = resm_smoke_workdir
  config.memory_usage.staleness = True
  config.memory_usage.max_tokens = 2048
  # One device: the sums are tested, not the sharding.
  config.mesh.data = 1
  config.data.cache_dir = os.path.join(resm_smoke_workdir, "cache")
  # Through the one dispatch: a mode that reads a trained run may name a
  # mesh smaller than the host's devices.
  res = memjax.run_mode("memory_usage", config, str(tmp_path))
  with open(tmp_path / "memory_usage.json") as f:
    saved = json.load(f)
  # The figure read back: per layer (columns of 4 inches) the read-count
  # histogram over the staleness bars (rows of 3 inches), at 100 dpi, drawn
  # in matplotlib's first colour (C0 #1f77b4).
  image = matplotlib.image.imread(tmp_path / "memory_usage.png")
  assert image.shape[:2] == (2 * 300, len(LAYERS) * 400)
  pixels = np.round(image[..., :3] * 255).astype(int).reshape(-1, 3)
  assert (np.abs(pixels - (0x1F, 0x77, 0xB4)).max(-1) <= 2).sum() > 100
  assert saved["step"] == 4 and set(saved["layers"]) == set(LAYERS)
  num_keys, heads, topk, _ = pkm_wt103.MEMORY["smoke"]
  # Whole windows only; a token reads a slot once however many heads do.
  window, batch = config.eval.window_len, config.eval.batch_size
  tokens = 2048 // window // batch * batch * window
  assert saved["count"] == "token"
  # Independently: the per-slot sums that the model itself sows over the
  # same windows at each checkpoint, and the metrics from them with NumPy.
  run = build.build(config, str(tmp_path), mesh={"data": 1})
  split = corpus_lib.load_corpus(
      run.settings.data,
      run.settings.eval,
      str(tmp_path),
      (config.memory_usage.split,),
      train=False,
  ).splits[config.memory_usage.split]
  windows = np.asarray(split.tokens[:tokens], np.int32).reshape(-1, window)
  sown = {
      step: _sown_sums(resm_smoke_workdir, step, windows) for step in (2, 4)
  }
  for layer in LAYERS:
    m = saved["layers"][layer]
    assert m["slots"] == num_keys**2
    assert tokens * topk <= m["reads"] <= tokens * heads * topk
    _in_range(m, num_keys**2)
    reads, top1, weights = (
        sown[4][layer][k] for k in ("reads", "top1", "weights")
    )
    assert m["reads"] == reads.sum()
    assert m["mu"] == np.mean(reads > 0)
    assert m["top1_mu"] == np.mean(top1 > 0)
    np.testing.assert_allclose(m["kl_u"], _kl_uniform(reads), rtol=1e-5)
    np.testing.assert_allclose(m["kl_w"], _kl_uniform(weights), rtol=1e-5)
    # Staleness: the last checkpoint at which each slot was a top-1.
    used = {s: sown[s][layer]["top1"] > 0 for s in (2, 4)}
    assert saved["staleness"][layer] == {
        "never": int(np.sum(~used[2] & ~used[4])),
        "2": int(np.sum(used[2] & ~used[4])),
        "4": int(np.sum(used[4])),
    }
  assert res["summary_lines"][0].startswith(LAYERS[0])
  # Counted per head: every head's k reads of every token.
  config.memory_usage.update(staleness=False, count="head")
  heads_res = memjax.run_mode("memory_usage", config, str(tmp_path / "heads"))
  for layer in LAYERS:
    m, t = heads_res["layers"][layer], saved["layers"][layer]
    assert m["reads"] == tokens * heads * topk
    assert m["mu"] == t["mu"]  # the same slots are read
  config.memory_usage.count = "slot"
  with pytest.raises(errors.ConfigError, match="memory_usage.count"):
    memjax.run_mode("memory_usage", config, str(tmp_path / "bad"))


def _sown_sums(run, step, windows):
  """{layer: {'reads', 'top1', 'weights'} [K] float64} that the model at
  ``step`` sows over ``windows`` [N, T] in one batch."""
  r = dispatch.restore(run, step=step, mesh={"data": 1})
  _, sown = r.model.apply(
      {"params": r.params},
      windows,
      None,
      True,
      method=r.model.forward,
      mutable=["pkm_usage"],
  )
  out = {}
  flat = flax.traverse_util.flatten_dict(sown["pkm_usage"], sep="/")
  for key, value in flat.items():
    layer, name = key.rsplit("/", 1)
    out.setdefault(layer, {})[name] = np.asarray(value, np.float64)
  return out


def _kl_uniform(counts):
  """KL(p || uniform) of p = counts / sum, in nats (0 log 0 = 0)."""
  p = counts[counts > 0] / counts.sum()
  return np.log(len(counts)) + np.sum(p * np.log(p))


def _config(**options):
  config = pkm_wt103.get_config("pkm_smoke")
  for k, v in options.items():
    if k == "feed_forward_layers":
      config.model.feed_forward_layers = v
    else:
      config.model.feed_forward_options[k] = v
  return config


@pytest.mark.parametrize(
    "options, message",
    [
        (
            dict(feed_forward_layers=(0, 2)),
            r"has 0: layer numbers count from 1",
        ),
        (dict(feed_forward_layers=(3,)), r"to model.num_layers 2$"),
        (dict(topk=17), r"topk 17 must be between 1 and num_keys 16"),
        (
            dict(query_norm="batch"),
            r"query_norm='batch' in the causal .* set "
            r"model.feed_forward_options.allow_batchnorm_future_leak=True",
        ),
    ],
)
def test_bad_memory_settings_are_config_errors(options, message, tmp_path):
  with pytest.raises(errors.ConfigError, match=message) as e:
    build.build(_config(**options), str(tmp_path))
  assert "\n" not in str(e.value)
