"""The test suite; its layout mirrors vit/. Shared fixtures live in conftest.py."""

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
SCRIPTS = ROOT / "scripts"


def load_script(name: str) -> ModuleType:
    """A script under scripts/ as a module (scripts are not a package), so tests call its functions."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
