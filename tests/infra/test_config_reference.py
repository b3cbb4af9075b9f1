"""docs/configuration.md is the reference generated from the settings classes, and the generator
covers every service `chorus serve` runs."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from services import config_reference
from services.cli import SERVICE_MODULES
from tests.infra.compose import ROOT

DOC = ROOT / "docs" / "configuration.md"
REGENERATE = "python -m services.config_reference --write docs/configuration.md"


def test_the_documented_reference_is_the_generated_one() -> None:
    document = DOC.read_text()
    assert config_reference.BEGIN in document and config_reference.END in document, (
        f"{DOC} lost its markers; put them back and run: {REGENERATE}"
    )
    assert config_reference.generated_part(document) == config_reference.render(), (
        f"{DOC} is out of date with the settings classes; run: {REGENERATE}"
    )


def test_every_service_has_a_section() -> None:
    """Each service's settings have a section; a process of several roles (the worker) reads
    nothing but its roles' settings, and their sections name it."""
    modules = {section.module for section in config_reference.SECTIONS}
    assert "services.common.settings" in modules
    documented = {name for s in config_reference.SECTIONS for name in config_reference.settings_class(s).model_fields}
    rendered = config_reference.render()
    for service, module in SERVICE_MODULES.items():
        if f"{module}.settings" in modules:
            continue
        fields = importlib.import_module(f"{module}.settings").Settings.model_fields
        assert set(fields) <= documented, f"{service}: settings of its own need a section"
        assert rendered.count(f"`chorus serve {service}`") >= 2, f"{service}: its roles' sections name it"


def test_every_setting_has_a_description_and_a_row() -> None:
    rendered = config_reference.render()
    for section in config_reference.SECTIONS:
        cls = config_reference.settings_class(section)
        for name, field in config_reference.fields(section):
            assert field.description, f"{section.module}: {name} needs Field(description=...)"
            assert f"| `{config_reference.env_names(cls, name, field)[0]}`" in rendered, name


def test_splicing_replaces_only_the_generated_part() -> None:
    document = f"head\n{config_reference.BEGIN}\nold\n{config_reference.END}\ntail\n"
    spliced = config_reference.splice(document, "new\n")
    assert spliced == f"head\n{config_reference.BEGIN}\nnew\n{config_reference.END}\ntail\n"
    assert config_reference.generated_part(spliced) == "new\n"
    with pytest.raises(ValueError, match="markers"):
        config_reference.splice("no markers here", "new\n")


def test_the_module_prints_the_reference() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "services.config_reference"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == config_reference.render()
