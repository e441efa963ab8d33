"""The test suite; its layout mirrors vit/. Shared fixtures live in conftest.py."""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
SCRIPTS = ROOT / "scripts"


def script_path(name: str) -> Path:
    """scripts/<bench|experiments|gpu>/NAME.py."""
    (path,) = SCRIPTS.glob(f"*/{name}.py")
    return path


def load_script(name: str) -> ModuleType:
    """A script under scripts/ as a module (scripts are not a package), so tests call its functions. Its folder goes
    on sys.path first, as running it puts it there: a script imports its siblings by name."""
    path = script_path(name)
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
