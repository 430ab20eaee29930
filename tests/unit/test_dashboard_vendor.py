"""The dashboard's vendored charting library (``agents/monitor/static/vendor``): each file is byte for byte the
one recorded in ``MANIFEST.json`` (sha256, npm package and version), its license ships beside it, the page loads it
from the monitor (never a CDN), the monitor serves it, and the wheel packages it."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import tomllib
from pathlib import Path
from typing import Any

from agents.monitor import dashboard

ROOT = Path(__file__).resolve().parents[2]
VENDOR = ROOT / "agents" / "monitor" / "static" / "vendor"
#: The files that describe the vendored ones (ours, not upstream's).
OWN = {"MANIFEST.json", "README.md"}


def _manifest() -> dict[str, Any]:
    files: dict[str, Any] = json.loads((VENDOR / "MANIFEST.json").read_text(encoding="utf-8"))["files"]
    return files


def sha256_problems(folder: Path, files: dict[str, Any]) -> list[str]:
    """Files of ``folder`` whose sha256 differs from the manifest's, and files on one side only."""
    present = {p.name for p in folder.iterdir() if p.is_file()} - OWN
    problems = [f"{name}: not in the manifest" for name in sorted(present - set(files))]
    problems += [f"{name}: in the manifest, missing" for name in sorted(set(files) - present)]
    for name in sorted(present & set(files)):
        digest = hashlib.sha256((folder / name).read_bytes()).hexdigest()
        if digest != files[name]["sha256"]:
            problems.append(f"{name}: sha256 {digest}, the manifest says {files[name]['sha256']}")
    return problems


def test_vendored_files_are_the_recorded_npm_files() -> None:
    files = _manifest()
    assert sha256_problems(VENDOR, files) == []
    assert {f["package"] for f in files.values()} == {"d3", "@observablehq/plot"}
    for name, f in files.items():
        if name.endswith(".js"):
            head = (VENDOR / name).read_bytes()[:120].decode()
            assert f"v{f['version']}" in head, (name, head)  # the bundle's own banner names the same version
            assert (VENDOR / f["license_file"]).is_file() and f["license"] == "ISC"
            assert f["version"] in f["tarball"] and f["tarball_integrity"].startswith("sha512-")
    # Plot's UMD bundle was built against the d3 vendored beside it
    assert f"d3@{files['d3.min.js']['version']}/" in (VENDOR / "plot.umd.min.js").read_bytes()[:400].decode()


def test_a_changed_byte_is_caught(tmp_path: Path) -> None:
    files = _manifest()
    for name in files:
        (tmp_path / name).write_bytes((VENDOR / name).read_bytes())
    changed = bytearray((tmp_path / "d3.min.js").read_bytes())
    changed[-2] ^= 1
    (tmp_path / "d3.min.js").write_bytes(bytes(changed))
    (tmp_path / "extra.js").write_bytes(b"")
    problems = sha256_problems(tmp_path, files)
    assert len(problems) == 2 and problems[0] == "extra.js: not in the manifest" and "d3.min.js: sha256" in problems[1]


def test_the_page_loads_the_library_from_the_monitor_and_the_monitor_serves_it() -> None:
    html = (VENDOR.parent / "dashboard.html").read_text(encoding="utf-8")
    scripts = [line.strip() for line in html.splitlines() if "<script" in line]
    assert scripts == [
        '<script src="/dashboard/vendor/d3.min.js"></script>',
        '<script src="/dashboard/vendor/plot.umd.min.js"></script>',
        '<script src="/dashboard/dashboard.js"></script>',
    ]
    for name in ("d3.min.js", "plot.umd.min.js"):
        served = dashboard.asset(f"vendor/{name}")
        assert served is not None and served[0] == (VENDOR / name).read_bytes()
        assert served[1] == "text/javascript"


def test_the_wheel_ships_the_vendored_files() -> None:
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"][
        "package-data"
    ]["agents"]
    for path in VENDOR.iterdir():
        relative = f"monitor/static/vendor/{path.name}"
        assert any(fnmatch.fnmatch(relative, p) for p in patterns), relative
