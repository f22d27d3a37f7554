"""Calibration input (base/hf/calibrate.py): the text stream cut into fixed windows."""
from __future__ import annotations

from base.config import CalibConfig
from base.hf.calibrate import token_batches
from base.hf.loading import byte_tokenizer


def test_the_stream_is_cut_into_windows_without_transformers_warning_about_its_length(caplog):
    """The whole calibration text is tokenised at once, longer than the model's context on purpose:
    windows of seq_len, batch_size per batch, and no "Token indices sequence length" warning."""
    tok = byte_tokenizer()
    tok.model_max_length = 16
    text = "abcdefgh" * 40  # 320 byte tokens, 20 times the context
    batches = token_batches(tok, text, CalibConfig(files=["unused.txt"], num_tokens=100, seq_len=10, batch_size=4))
    assert [b.shape for b in batches] == [(4, 10), (4, 10), (2, 10)]
    assert tok.decode(batches[0][0]) == "abcdefghab"
    assert not [r for r in caplog.records if "Token indices sequence length" in r.getMessage()]
