"""The test suite; its layout mirrors vit/. Shared fixtures live in conftest.py."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
SCRIPTS = ROOT / "scripts"
