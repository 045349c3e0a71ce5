"""A residual product-key memory inserted into an imported Llama.

Kim & Jung's rule, as PKM-BERT starts from BERT: every parameter of the
memory-less model is restored, the memory layer's FFN from that layer's FFN
(``layer_i/ffn/dense/`` <- ``layer_i/ffn/``), the memory's queries and
keys fresh. ResM adds the memory to the FFN; with its values at zero it
reads 0, so at initialisation the inserted model computes exactly what the
imported one does.
"""

import json
import os

import numpy as np

from configs import pretrained
import memjax
from memjax.data import sources
from tests.conftest import REPO
from tests.conftest import run_main

FIXTURE = os.path.join(REPO, "tests", "fixtures", "pretrained", "llama_gqa")


def _import_and_corpus(tmp_path) -> tuple[str, str]:
  """(the imported tiny Llama's workdir, a 'text' corpus directory cut from
  the shipped raw WikiText)."""
  source = str(tmp_path / "llama")
  c = pretrained.get_config("import")
  c.pretrained.path = FIXTURE
  memjax.run_mode("import", c, source)
  raw = os.path.join(sources.default_data_dir("wikitext_raw"), "wiki.valid.raw")
  with open(raw, encoding="utf-8", newline="") as f:
    text = f.read()
  data = tmp_path / "text"
  data.mkdir()
  texts = {"train": text[:2000], "valid": text[2000:3000], "test": text[:10]}
  for split, t in texts.items():
    (data / f"{split}.txt").write_text(t, encoding="utf-8")
  return source, str(data)


def test_resm_in_an_imported_llama_starts_as_the_llama(tmp_path):
  source, data = _import_and_corpus(tmp_path)
  workdir = str(tmp_path / "pkm")
  proc = run_main(
      "--config=configs/pretrained.py:llama_pkm",
      f"--config.train.init_from={source}",
      "--config.data.corpus=text",
      f"--config.data.data_dir={data}",
      "--config.model.feed_forward_options.num_keys=8",
      "--config.model.feed_forward_options.topk=4",
      "--config.model.feed_forward_options.k_dim=16",
      "--config.data.seq_len=32",
      "--config.data.batch_size=2",
      # One update of learning rate 0: the parameters stay the initial ones.
      "--config.train.num_steps=1",
      "--config.optim.learning_rate=0.0",
      "--config.eval.splits=('valid',)",
      f"--workdir={workdir}",
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  log = proc.stdout + proc.stderr
  assert "fresh: layer_0/ffn/memory/keys" in log  # Layer -2 of 2: layer_0.
  with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
    model = json.load(f)["model"]
  assert model["feed_forward"] == "resm" and model["feed_forward_layers"] == [1]
  assert model["feed_forward_options"]["base"] == "glu"
  # The memory layer's FFN is the Llama's (mapped), its values zero.
  pkm = memjax.load(workdir).restored.params
  llama = memjax.load(source).restored.params
  for name in ("gate", "up", "down"):
    np.testing.assert_array_equal(
        np.asarray(pkm["layer_0"]["ffn"]["dense"][name]["kernel"]),
        np.asarray(llama["layer_0"]["ffn"][name]["kernel"]),
    )
  assert not np.any(np.asarray(pkm["layer_0"]["ffn"]["memory"]["values"]))
  # Its evaluation is the imported model's score of the same text.
  with open(os.path.join(workdir, "results.json"), encoding="utf-8") as f:
    got = json.load(f)["valid"]
  with open(os.path.join(data, "valid.txt"), encoding="utf-8") as f:
    want = memjax.load(source).score(f.read())
  assert got["tokens"] == want["tokens"]
  np.testing.assert_allclose(got["nll"], want["nll"], rtol=1e-6)


def test_pkm_in_place_of_an_imported_feed_forward(tmp_path):
  # Lample et al.'s placement: the memory replaces layer -2's SwiGLU; every
  # other parameter comes from the import, the replaced ones are reported
  # unused, and the run trains and evaluates through memjax.main.
  source, data = _import_and_corpus(tmp_path)
  workdir = str(tmp_path / "pkm")
  proc = run_main(
      "--config=configs/pretrained.py:llama_pkm_replace",
      f"--config.train.init_from={source}",
      "--config.data.corpus=text",
      f"--config.data.data_dir={data}",
      "--config.model.feed_forward_options.num_keys=8",
      "--config.model.feed_forward_options.topk=4",
      "--config.model.feed_forward_options.k_dim=16",
      "--config.data.seq_len=32",
      "--config.data.batch_size=2",
      "--config.train.num_steps=2",
      "--config.eval.splits=('valid',)",
      f"--workdir={workdir}",
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  log = proc.stdout + proc.stderr
  assert "fresh: layer_0/ffn/memory/keys" in log
  assert "not used: layer_0/ffn/down/kernel" in log
  pkm = memjax.load(workdir).restored.params
  llama = memjax.load(source).restored.params
  assert set(pkm["layer_0"]["ffn"]) == {"memory"}
  # The other layer, attention included, is the import's (2 steps of
  # training moved it by the learning rate's warm-up only).
  np.testing.assert_allclose(
      np.asarray(pkm["layer_1"]["ffn"]["up"]["kernel"]),
      np.asarray(llama["layer_1"]["ffn"]["up"]["kernel"]),
      atol=1e-3,
  )
  with open(os.path.join(workdir, "results.json"), encoding="utf-8") as f:
    assert np.isfinite(json.load(f)["valid"]["nll"])
