"""How differently a memory layer is read for two classes (Kim & Jung's
Figure 4).

From the top-1 counts per slot of the positive examples t+ and of the
negative examples t- (``'pkm_usage'`` sums, ``memjax.methods.pkm.layer``):

* IOU = sum_i min(t+_i, t-_i) / sum_i max(t+_i, t-_i): 1 when both classes
  pick the same slots equally often, 0 when they share no slot;
* KL(P+ || P-) of the normalised counts P = t / sum(t). A slot one class
  never picks would make it infinite, so both distributions get a floor of
  ``floor`` per slot before normalising (1e-10: disjoint use then reads
  about log(1e10) = 23 nats times the mass involved).
"""

from __future__ import annotations

import numpy as np

FLOOR = 1e-10


def iou(pos: np.ndarray, neg: np.ndarray) -> float:
  """[K] counts -> intersection over union of the two count vectors."""
  pos, neg = np.asarray(pos, np.float64), np.asarray(neg, np.float64)
  union = np.sum(np.maximum(pos, neg))
  return float(np.sum(np.minimum(pos, neg)) / union) if union > 0 else 0.0


def kl(pos: np.ndarray, neg: np.ndarray, floor: float = FLOOR) -> float:
  """[K] counts -> KL(P+ || P-) in nats of the floored, normalised counts."""

  def dist(t):
    t = np.asarray(t, np.float64)
    p = t / max(np.sum(t), 1e-300)
    p = np.maximum(p, floor)
    return p / np.sum(p)

  p, q = dist(pos), dist(neg)
  return float(np.sum(p * (np.log(p) - np.log(q))))


def compare(
    pos: dict[str, np.ndarray], neg: dict[str, np.ndarray]
) -> dict[str, dict[str, float]]:
  """{layer: {'kl', 'iou'}} of per-layer top-1 counts of the two classes."""
  return {
      layer: {
          "kl": kl(pos[layer], neg[layer]),
          "iou": iou(pos[layer], neg[layer]),
      }
      for layer in sorted(set(pos) & set(neg))
  }
