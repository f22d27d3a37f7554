"""base/hf/compat.py: a leftover Hugging Face `kernels` install is named before transformers trips on it."""
from importlib import metadata

import pytest

from base.config import ConfigError
from base.hf import compat


def _version_of(installed: dict):
    def version(name):
        if name not in installed:
            raise metadata.PackageNotFoundError(name)
        return installed[name]
    return version


def test_hf_kernels_installed_fails_with_what_to_do(monkeypatch):
    monkeypatch.setattr(compat.metadata, "version", _version_of({"kernels": "0.19.1"}))
    with pytest.raises(ConfigError, match=r"`kernels` package \(0.19.1\).*pip uninstall kernels.*<5.25"):
        compat.check_kernels_name_clash()


def test_without_hf_kernels_the_check_passes(monkeypatch):
    monkeypatch.setattr(compat.metadata, "version", _version_of({"transformers": "5.24.0"}))
    compat.check_kernels_name_clash()
