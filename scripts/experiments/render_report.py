"""Render a `vit audit` report.html in headless Chromium and save a screenshot, to see it as a browser does.

    python scripts/experiments/render_report.py audit/report.html --png report.png [--width 1280 --height 2400]

Uses the first Chromium-family browser found: ``$CHROME``, then chromium, chromium-browser, google-chrome,
google-chrome-stable on the PATH (Debian: ``apt-get install chromium``). The page needs no network and runs no
script; the browser is started with networking pointed nowhere, so an external URL in the page could not load.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_browser() -> str | None:
    """A Chromium-family executable, or None."""
    candidates = [os.environ.get("CHROME")] + [shutil.which(name) for name in BROWSERS]
    return next((c for c in candidates if c and Path(c).is_file()), None)


def render(html: Path, png: Path, width: int, height: int) -> Path:
    """Screenshot ``html`` (a local file) to ``png`` with headless Chromium."""
    browser = find_browser()
    if browser is None:
        raise SystemExit(f"no Chromium-family browser found (tried $CHROME and {', '.join(BROWSERS)} on the PATH); "
                         "install one, e.g. `apt-get install chromium`, or set CHROME=/path/to/chrome")
    with tempfile.TemporaryDirectory() as profile:
        command = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                   "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>",  # nothing external can load
                   f"--user-data-dir={profile}", f"--window-size={width},{height}",
                   f"--screenshot={png.resolve()}", html.resolve().as_uri()]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if done.returncode != 0 or not png.is_file():
        raise SystemExit(f"{browser} failed ({done.returncode}): {done.stderr[-2000:]}")
    return png


def main(argv: list[str] | None = None) -> Path:
    """Render the report given on the command line; returns the PNG's path."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("html", type=Path, help="report.html written by `vit audit`")
    parser.add_argument("--png", type=Path, default=None, help="the screenshot (default: beside the report)")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=2400)
    args = parser.parse_args(argv)
    png = render(args.html, args.png or args.html.with_suffix(".png"), args.width, args.height)
    print(f"wrote {png}", file=sys.stderr)
    return png


if __name__ == "__main__":
    main()
