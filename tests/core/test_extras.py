"""Loom's extras in one table: each is an extra of pyproject.toml, installed from a checkout;
a missing one is a typed error naming the command, the extra and its install line."""

from __future__ import annotations

import pickle
import sys
import tomllib
from pathlib import Path

import pytest

from loom.core.errors import LoomError, MissingExtraError
from loom.core.extras import MODULES, Extra, install_line, require

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_every_extra_is_one_of_the_projects() -> None:
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    assert {e.value for e in Extra} <= set(extras)
    assert set(MODULES) == set(Extra)


def test_the_install_line_installs_from_a_checkout() -> None:
    assert install_line(Extra.CPU_ENGINE).startswith(
        "pip install -e '.[cpu-engine]' && pip uninstall"
    )


def test_a_missing_module_raises_the_typed_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # its import fails: not installed
    with pytest.raises(MissingExtraError) as info:
        require("loom serve rollout --ray", Extra.RAY)
    err = info.value
    assert (err.command, err.extra, err.module) == ("loom serve rollout --ray", "ray", "ray")
    assert isinstance(err, LoomError) and isinstance(err, ImportError)
    assert str(err) == (
        "loom serve rollout --ray needs Loom's 'ray' extra (ray is not installed); install it "
        "from your Loom checkout: pip install -e '.[ray]'"
    )
    assert str(pickle.loads(pickle.dumps(err))) == str(err)


def test_an_installed_extra_passes() -> None:
    pytest.importorskip("torch")
    require("loom serve cluster", Extra.TORCH)
