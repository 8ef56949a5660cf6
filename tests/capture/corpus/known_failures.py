"""Corpus rows that fail today, with the first failure reason: the harness marks each
``"<group>::<id>"`` listed here xfail(strict=False). Regenerate the reasons with
``python tests/capture/corpus/corpus_status.py`` and delete a line once its row passes
(an XPASS in the run says which ones).
"""

KNOWN_FAILURES: dict[str, str] = {
}
