"""Whether the installed transformers can import beside this repository's `kernels/` package.

    check_kernels_name_clash()   # raises ConfigError before anything imports a transformers model

transformers 5.25 and newer require Hugging Face's `kernels` distribution, and any transformers
that finds it installed imports names from it (`from kernels import CUDAProperties`, ...). Its
top-level name is the name of this repository's Triton package, which comes first on the path of
every entry point here, so that import fails deep inside transformers with an ImportError that
does not say why. pyproject.toml caps transformers below 5.25, which does not need it; this check
turns a leftover install into a message that says what to do.
"""
from __future__ import annotations

from importlib import metadata

from base.config import ConfigError


def check_kernels_name_clash() -> None:
    try:
        version = metadata.version("kernels")
    except metadata.PackageNotFoundError:
        return
    raise ConfigError(
        f"Hugging Face's `kernels` package ({version}) is installed; its name is this repository's "
        "kernels/ package, so transformers would import ours in its place and fail. Uninstall it "
        "(`pip uninstall kernels`) and keep transformers>=5.17,<5.25 as pyproject.toml pins it "
        "(5.25 and newer require it).")
