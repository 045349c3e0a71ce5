"""BLEU and chrF with sacreBLEU on detokenised, cased output.

sacreBLEU (not our own n-gram counting) so that the numbers and their
signatures are the ones papers report: BLEU with the 13a tokeniser on cased
text, chrF, and the lowercased BLEU that fairseq's IWSLT recipe reports as a
second number.
"""

from __future__ import annotations

from typing import Any, Sequence


def score(
    hypotheses: Sequence[str], references: Sequence[str]
) -> dict[str, Any]:
  """Corpus scores of ``hypotheses`` against their references.

  Args:
    hypotheses: detokenised output, one per sentence.
    references: one reference per sentence, or a list of reference streams
      (each one reference per sentence).

  Returns:
    {'bleu', 'chrf', 'bleu_lowercase': float, 'bleu_signature',
    'chrf_signature', 'bleu_lowercase_signature': str, 'sentences': int}.
  """
  hyps = list(hypotheses)
  if references and not isinstance(references[0], str):
    refs = [list(r) for r in references]
  else:
    refs = [list(references)]
  if any(len(r) != len(hyps) for r in refs):
    raise ValueError(f"{len(hyps)} hypotheses for {len(refs[0])} references")
  # Imported here: every run imports this module (the catalog's modes), and
  # only translation scores need sacreBLEU.
  import sacrebleu  # pylint: disable=g-import-not-at-top

  bleu = sacrebleu.metrics.BLEU(tokenize="13a")
  bleu_lc = sacrebleu.metrics.BLEU(tokenize="13a", lowercase=True)
  chrf = sacrebleu.metrics.CHRF()
  out = {"sentences": len(hyps)}
  for name, metric in (
      ("bleu", bleu),
      ("bleu_lowercase", bleu_lc),
      ("chrf", chrf),
  ):
    out[name] = float(metric.corpus_score(hyps, refs).score)
    out[f"{name}_signature"] = str(metric.get_signature())
  return out


def summary(scores: dict[str, Any], name: str = "") -> str:
  """One line: BLEU (cased), lowercased BLEU and chrF with the signatures."""
  head = f"{name}: " if name else ""
  return (
      f"{head}BLEU {scores['bleu']:.2f} ({scores['bleu_signature']})  "
      f"lowercased BLEU {scores['bleu_lowercase']:.2f}  "
      f"chrF {scores['chrf']:.2f} ({scores['chrf_signature']})"
  )
