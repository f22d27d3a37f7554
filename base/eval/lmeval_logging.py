"""lm-eval warns on every run about two things this project does on purpose: it passes a loaded
model object to HFLM (not a hub name), and the mini tasks load their local JSONL through a
`custom_dataset` function. `quiet_expected_warnings()` drops those messages, matched by the text
lm-eval 0.4.13 logs (and by the wording of the release before it); every other warning still shows."""
from __future__ import annotations

import logging

EXPECTED = (
    "Passed an already-initialized model through `pretrained`",  # lm_eval/models/huggingface.py, HFLM.__init__
    "`pretrained` model kwarg is not of type `str`",  # the same, as earlier releases worded it
    "Custom kwargs can be passed to `--metadata`",  # lm_eval/api/task.py, custom_dataset
)


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
