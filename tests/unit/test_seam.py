"""The one seam (dplib.seam): every protocol's numpy twin and Spark implementation answer every
question the protocol declares, with the same parameters. The bit-for-bit agreement of the twins is in the contract tests
each seam names (tests/spark)."""

from __future__ import annotations

import importlib
import inspect
import pathlib
import re

import pytest

from dplib.seam import SEAMS

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _load(path: str):
    module, name = path.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


def _members(protocol) -> dict[str, inspect.Signature | None]:
    out = {}
    for name, value in vars(protocol).items():
        if name.startswith("_"):
            continue
        out[name] = inspect.signature(value) if callable(value) else None
    for name in getattr(protocol, "__annotations__", {}):
        out.setdefault(name, None)
    return out


@pytest.mark.parametrize("seam", SEAMS, ids=lambda s: s.protocol.__name__)
@pytest.mark.parametrize("side", ["numpy_twin", "spark"])
def test_implementations_answer_every_question(seam, side):
    impl = _load(getattr(seam, side))
    for name, sig in _members(seam.protocol).items():
        if sig is None:  # an attribute (k, m, d, n): assigned in the class or a base (maybe unpacked)
            src = "\n".join(inspect.getsource(c) for c in impl.__mro__ if c is not object)
            assert re.search(rf"self\.{name}\b[^=\n]*=(?!=)|def {name}\(", src), (impl, name)
            continue
        assert hasattr(impl, name), f"{impl.__name__} lacks {name}"
        got = list(inspect.signature(getattr(impl, name)).parameters)
        want = list(sig.parameters)
        assert got == want, f"{impl.__name__}.{name}{got} != protocol {want}"


@pytest.mark.parametrize("seam", SEAMS, ids=lambda s: s.protocol.__name__)
def test_contract_tests_exist(seam):
    for path in seam.contract_tests:
        assert (ROOT / path).is_file(), path
