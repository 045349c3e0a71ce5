"""kNN-LM on an imported GPT-2 against a NumPy GPT-2 and a NumPy kNN-LM.

The datastore's keys must be the NumPy model's input to the last block's
feed-forward (``ln_2`` of the residual stream after the last attention:
knn-transformers' ``last_ffn_input``, the input of ``h[-1].mlp``), its
values the next tokens; ``--mode=memeval``'s kNN-LM must give the NumPy
interpolation lam p_kNN + (1 - lam) p_LM over the K nearest keys by
squared L2 distance.
"""

import json
import os
import shutil

import numpy as np
from safetensors.numpy import load_file

from memjax.data import tokenizer_vocab
from memjax.memory import datastore as ds_lib
from tests.conftest import REPO
from tests.conftest import run_main

FIXTURE = os.path.join(REPO, "tests", "fixtures", "pretrained", "gpt2")
TEXTS = {
    "train": "the cat sat on the mat. the dog sat on the cat.",
    "valid": "the cat sat on the dog.",
    "test": "a cat.",
}
K, LAMBDA = 4, 0.25


def _layer_norm(x, w, b, eps=1e-5):
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + eps) * w + b


def _gelu_new(x):
  return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def numpy_gpt2(ids):
  """ids [T] -> (last block's feed-forward input [T, D], log p [T, V])."""
  t = {
      k.removeprefix("transformer."): v.astype(np.float64)
      for k, v in load_file(os.path.join(FIXTURE, "model.safetensors")).items()
  }
  n, (d, heads) = len(ids), (32, 4)
  h = t["wte.weight"][ids] + t["wpe.weight"][:n]
  causal = np.tril(np.ones([n, n], bool))
  for i in range(2):
    p = lambda name: t[f"h.{i}.{name}"]  # pylint: disable=cell-var-from-loop
    x = _layer_norm(h, p("ln_1.weight"), p("ln_1.bias"))
    q, k, v = np.split(
        x @ p("attn.c_attn.weight") + p("attn.c_attn.bias"), 3, -1
    )
    q, k, v = (
        a.reshape(n, heads, d // heads).transpose(1, 0, 2) for a in (q, k, v)
    )
    s = np.where(causal, q @ k.transpose(0, 2, 1) / np.sqrt(d // heads), -1e30)
    a = np.exp(s - s.max(-1, keepdims=True))
    a = (a / a.sum(-1, keepdims=True)) @ v
    h = (
        h
        + a.transpose(1, 0, 2).reshape(n, d) @ p("attn.c_proj.weight")
        + p("attn.c_proj.bias")
    )
    g = _layer_norm(h, p("ln_2.weight"), p("ln_2.bias"))
    f = _gelu_new(g @ p("mlp.c_fc.weight") + p("mlp.c_fc.bias"))
    h = h + f @ p("mlp.c_proj.weight") + p("mlp.c_proj.bias")
  logits = _layer_norm(h, t["ln_f.weight"], t["ln_f.bias"]) @ t["wte.weight"].T
  m = logits.max(-1, keepdims=True)
  logp = logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))
  return g, logp


def test_knn_lm_of_an_imported_gpt2_is_numpys(imported_gpt2, tmp_path):
  workdir, data = str(tmp_path / "gpt2"), tmp_path / "text"
  shutil.copytree(imported_gpt2, workdir)
  data.mkdir()
  for split, text in TEXTS.items():
    (data / f"{split}.txt").write_text(text, encoding="utf-8")
  with open(os.path.join(FIXTURE, "tokenizer.json"), encoding="utf-8") as f:
    vocab = tokenizer_vocab.TokenizerVocabulary(f.read(), 64)
  ids = {s: np.array(vocab.encode(t)) for s, t in TEXTS.items()}
  assert max(len(x) for x in ids.values()) <= 32  # One window each.
  flags = (
      "--config=configs/pretrained.py:gpt2_knn",
      "--config.data.corpus=text",
      f"--config.data.data_dir={data}",
      f"--config.eval_memory.ext_k={K}",
      f"--config.external.knn_lambda={LAMBDA}",
      "--config.eval.splits=('valid',)",
      f"--workdir={workdir}",
  )
  for mode in ("datastore", "index", "memeval"):
    proc = run_main(*flags, f"--mode={mode}")
    assert proc.returncode == 0, proc.stderr[-3000:]
  # The keys: the NumPy model's last feed-forward input at each position.
  store = ds_lib.open_datastore(os.path.join(workdir, "datastore"))
  keys = np.concatenate(store.keys).astype(np.float64)
  values = np.concatenate(store.values)
  g_train, _ = numpy_gpt2(ids["train"])
  np.testing.assert_array_equal(values, ids["train"][1:])
  np.testing.assert_allclose(keys, g_train[:-1], atol=2e-3, rtol=2e-3)
  # kNN-LM over the stored keys, in NumPy.
  g, logp = numpy_gpt2(ids["valid"])
  targets = ids["valid"][1:]
  queries = g[:-1]
  dist = ((queries[:, None] - keys[None]) ** 2).sum(-1)
  near = np.argsort(dist, -1)[:, :K]
  d = np.take_along_axis(dist, near, -1)
  w = np.exp(-(d - d.min(-1, keepdims=True)))
  w /= w.sum(-1, keepdims=True)
  p_knn = (w * (values[near] == targets[:, None])).sum(-1)
  p_lm = np.exp(logp[np.arange(len(targets)), targets])
  nll = -np.mean(np.log(LAMBDA * p_knn + (1 - LAMBDA) * p_lm))
  with open(os.path.join(workdir, "memeval.json"), encoding="utf-8") as f:
    got = json.load(f)["valid"]
  assert got["memory"]["tokens"] == len(targets)
  np.testing.assert_allclose(
      got["plain"]["nll"], -np.mean(np.log(p_lm)), rtol=1e-5
  )
  np.testing.assert_allclose(got["memory"]["nll"], nll, rtol=1e-4)
  assert got["memory"]["nll"] < got["plain"]["nll"]


def test_a_datastore_of_a_tokenizer_adding_bos_is_built_with_it(tmp_path):
  fixture = os.path.join(REPO, "tests", "fixtures", "pretrained", "llama_bos")
  expected = np.load(os.path.join(fixture, "expected.npz"))
  window, score = (int(x) for x in expected["rolling"])
  workdir, data = str(tmp_path / "llama"), tmp_path / "text"
  data.mkdir()
  for split in ("train", "valid", "test"):
    (data / f"{split}.txt").write_text(str(expected["text"]), encoding="utf-8")
  flags = (
      "--config=configs/pretrained.py:gpt2_knn",
      "--config.data.corpus=text",
      f"--config.data.data_dir={data}",
      f"--config.eval.window_len={window}",
      f"--config.eval.score_len={score}",
      f"--config.eval_memory.ext_k={K}",
      "--config.eval.splits=('valid',)",
      f"--workdir={workdir}",
  )
  proc = run_main(
      *flags, f"--config.pretrained.path={fixture}", "--mode=import"
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  for mode in ("datastore", "index", "memeval"):
    proc = run_main(*flags, f"--mode={mode}")
    assert proc.returncode == 0, proc.stderr[-3000:]
  path = os.path.join(workdir, "datastore")
  store = ds_lib.open_datastore(path)
  ids = expected["text_ids"][0]
  np.testing.assert_array_equal(np.concatenate(store.values), ids[1:])
  assert store.manifest["context"]["window_bos"] == 1
  # The plain model in the memory windows: Hugging Face's BOS-led scores.
  with open(os.path.join(workdir, "memeval.json"), encoding="utf-8") as f:
    got = json.load(f)["valid"]
  want = expected["rolling_logprobs"].astype(np.float64)
  np.testing.assert_allclose(got["plain"]["nll"], -want.mean(), rtol=1e-5)
  # A datastore built without the BOS (an earlier version) is refused.
  manifest = os.path.join(path, "manifest.json")
  with open(manifest, encoding="utf-8") as f:
    m = json.load(f)
  del m["context"]["window_bos"]
  with open(manifest, "w", encoding="utf-8") as f:
    json.dump(m, f)
  proc = run_main(*flags, "--mode=memeval")
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert "built from text without the BOS" in proc.stderr
