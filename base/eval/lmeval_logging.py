"""lm-eval warns on every run about two things this project does on purpose: it passes a loaded
model object to HFLM (not a hub name), and the mini tasks load their local JSONL through a
`custom_dataset` function. `quiet_expected_warnings()` drops those two messages; every other
warning still shows."""
from __future__ import annotations

import logging

EXPECTED = ("`pretrained` model kwarg is not of type `str`", "Custom kwargs can be passed to `--metadata`")


class _ExpectedWarnings(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not any(text in record.getMessage() for text in EXPECTED)


_FILTER = _ExpectedWarnings()


def quiet_expected_warnings() -> None:
    """Idempotent: attach the filter to the two lm-eval loggers that emit them."""
    for name in ("lm_eval.api.task", "lm_eval.models.huggingface"):
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
