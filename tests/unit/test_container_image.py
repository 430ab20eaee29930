"""The container image's file set, rebuilt without a Docker engine: does ``ptel`` run from exactly what the
Dockerfile copies?

:func:`build_image_tree` reads the Dockerfile's ``COPY`` instructions, copies exactly those sources into an empty
directory (``/app`` of the image), builds the project's wheel from there (``pip wheel --no-deps``, as the image's
``pip install .`` does, with the ``[build-system]`` backend that the ``[test]`` extra installs) and installs it into a
fresh virtualenv. The fresh virtualenv sees, besides that wheel, only
the *runtime* dependency closure of the wheel's own ``Requires-Dist`` (no ``[test]`` extra), linked from this
checkout's ``.venv``, which ``make setup`` installed with the same ``constraints.txt`` as the image: so nothing is
downloaded and the check takes seconds. Then ``ptel --help`` and every sub-command's ``--help`` run there, from a
directory that is not the source tree. This fails when

* a package is missing from the Dockerfile's ``COPY`` list (``ModuleNotFoundError: No module named 'gateway'`` was
  issue 25's finding: ``ptel/cli.py`` imports every command);
* a top-level package is missing from ``pyproject.toml``'s ``[tool.setuptools.packages.find] include`` (the
  wheel leaves it out);
* a runtime import is not a declared dependency (the closure has no such distribution).

The three mutation tests below inject each of those faults into the copied tree and expect the check to fail.
The four builds are independent (each its own directory and virtualenv) and spend their time in subprocesses
(``pip wheel``, ``pip install``, ``ptel``), so the module's :func:`builds` fixture starts all four at once, on as
many cores as there are, and each test waits for its own: on the 2-core CI machine that is about half the wall time
of building them one after another. A mutation's build context is the Dockerfile's ``COPY`` sources and
``.dockerignore`` (all that the image's file set can come from), not the whole checkout.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from email.parser import Parser
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
WORKDIR = "/app"
PIP = (sys.executable, "-m", "pip")


@dataclass(frozen=True)
class Copy:
    """One ``COPY src... dest`` instruction (dest relative to the image's ``WORKDIR``)."""

    sources: tuple[str, ...]
    dest: str


def dockerfile_copies(text: str) -> list[Copy]:
    """The ``COPY`` instructions of a Dockerfile, in order; anything this parser would not reproduce exactly
    (``ADD``, ``COPY --from``, globs, another ``WORKDIR``) raises ``ValueError`` rather than being skipped."""
    joined = re.sub(r"\\\n", " ", text)
    copies: list[Copy] = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        op = words[0].upper()
        if op == "ADD":
            raise ValueError(f"ADD is not reproduced by this test: {line.strip()!r} (use COPY)")
        if op == "WORKDIR" and words[1:] != [WORKDIR]:
            raise ValueError(f"the test assumes WORKDIR {WORKDIR}: {line.strip()!r}")
        if op != "COPY":
            continue
        args = words[1:]
        if any(a.startswith("--") for a in args) or any(ch in a for a in args for ch in "*?["):
            raise ValueError(f"COPY options and globs are not reproduced by this test: {line.strip()!r}")
        if len(args) < 2:
            raise ValueError(f"COPY needs a source and a destination: {line.strip()!r}")
        copies.append(Copy(tuple(args[:-1]), args[-1]))
    if not copies:
        raise ValueError("the Dockerfile has no COPY instruction")
    return copies


def copy_file_set(copies: list[Copy], source: Path, app: Path) -> None:
    """Reproduce the image's ``/app`` from ``source`` (the build context) as Docker's COPY does: a directory's
    contents go to ``dest``, a file to ``dest/name`` when ``dest`` ends with ``/``; symbolic links stay links;
    ``.dockerignore``'s entries are left out."""
    ignored = (source / ".dockerignore").read_text().split() if (source / ".dockerignore").exists() else []
    names = {p.rstrip("/") for p in ignored if "/" not in p.rstrip("/") and "*" not in p}
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", *names)
    for c in copies:
        dest = app / c.dest.removeprefix("./")
        for src in c.sources:
            path = source / src
            if not path.exists() and not path.is_symlink():
                raise FileNotFoundError(f"COPY {src}: not in the build context {source}")
            if path.is_dir():
                shutil.copytree(path, dest, symlinks=True, ignore=ignore, dirs_exist_ok=True)
            else:
                target = dest / path.name if c.dest.endswith("/") else dest
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target, follow_symlinks=False)


def _runtime_closure(requires: list[str]) -> list[metadata.Distribution]:
    """The installed distributions that ``requires`` (``Requires-Dist`` lines, no extras) pull in, transitively."""
    seen: dict[str, metadata.Distribution] = {}
    todo = [Requirement(r) for r in requires]
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        key = re.sub(r"[-_.]+", "-", req.name).lower()
        if key in seen:
            continue
        dist = metadata.distribution(req.name)  # PackageNotFoundError: `make setup` did not install it
        seen[key] = dist
        todo.extend(Requirement(r) for r in dist.requires or [])
    return list(seen.values())


def link_dependencies(wheel: Path, into: Path) -> int:
    """Symlink every top-level file of the wheel's runtime dependency closure into ``into``; returns how many
    distributions that is."""
    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        meta = Parser().parsestr(zf.read(name).decode())
    closure = _runtime_closure(meta.get_all("Requires-Dist") or [])
    into.mkdir(parents=True)
    for dist in closure:
        base = Path(str(dist.locate_file("")))
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            link = into / top
            if not link.exists() and (base / top).exists():
                link.symlink_to(base / top)
    return len(closure)


@dataclass(frozen=True)
class ImageRun:
    returncode: int
    output: str


def build_image_tree(tmp: Path, *, dockerfile: str, context: Path = ROOT) -> ImageRun:
    """The Dockerfile's file set installed in a fresh virtualenv under ``tmp``, then ``ptel --help`` and each
    sub-command's ``--help`` run there; the first failure's status and output (or 0 and all output)."""
    app = tmp / "app"
    copy_file_set(dockerfile_copies(dockerfile), context, app)
    wheels = tmp / "wheels"
    build = subprocess.run(
        # the build backend of .venv (the [test] extra pins setuptools as [build-system] requires): no download
        [*PIP, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "--wheel-dir", str(wheels), str(app)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if build.returncode != 0:
        return ImageRun(build.returncode, f"pip wheel: {build.stdout}{build.stderr}")
    (wheel,) = wheels.glob("*.whl")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    install = subprocess.run(
        [*PIP, "--python", str(python), "install", "--quiet", "--no-deps", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if install.returncode != 0:
        return ImageRun(install.returncode, f"pip install: {install.stdout}{install.stderr}")
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    link_dependencies(wheel, tmp / "deps")
    Path(site, "_runtime_dependencies.pth").write_text(f"{tmp / 'deps'}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONNOUSERSITE"] = "1"
    outputs: list[str] = []
    top = subprocess.run(
        [str(venv / "bin" / "ptel"), "--help"], capture_output=True, text=True, cwd=tmp, env=env, timeout=120
    )
    outputs.append(top.stdout + top.stderr)
    if top.returncode != 0:
        return ImageRun(top.returncode, "\n".join(outputs))
    # every sub-command's --help in one interpreter (each `ptel` start imports the whole project: ~2 s)
    script = (
        "import contextlib, io, sys\n"
        "import gateway, ptel\n"
        "from ptel.cli import build_parser, main\n"
        "for module in (ptel, gateway):\n"
        f"    assert module.__file__.startswith({site!r}), ('imported from outside the image', module.__file__)\n"
        "parser = build_parser()\n"
        "commands = sorted(next(a for a in parser._actions if a.dest == 'command').choices)\n"
        "print('commands:', ' '.join(commands))\n"
        "for name in commands:\n"
        "    out = io.StringIO()\n"
        "    with contextlib.redirect_stdout(out):\n"
        "        try:\n"
        "            main([name, '--help'])\n"
        "        except SystemExit as done:\n"
        "            code = done.code\n"
        "        else:\n"
        "            code = 'no exit'\n"
        "    if code != 0 or 'usage: ptel ' + name not in out.getvalue():\n"
        "        sys.exit(f'ptel {name} --help: exit {code}: {out.getvalue()}')\n"
    )
    subs = subprocess.run([str(python), "-c", script], capture_output=True, text=True, cwd=tmp, env=env, timeout=120)
    outputs.append(subs.stdout + subs.stderr)
    return ImageRun(subs.returncode, "\n".join(outputs))


DOCKERFILE = (ROOT / "Dockerfile").read_text()
#: The three injected faults (see the module docstring).
FAULTS = ("COPY gateway", "include gateway*", "dependency structlog")


def _pyproject_without(package: str) -> str:
    text = (ROOT / "pyproject.toml").read_text()
    mutated = text.replace(f'"{package}*", ', "")
    assert mutated != text, f"{package}* is not in pyproject.toml's include list"
    return mutated


def _mutated_build(tmp: Path, fault: str) -> ImageRun:
    """The image's file set with ``fault`` injected, built and run by :func:`build_image_tree`."""
    context = tmp / "context"
    context.mkdir(parents=True)
    for source in {src for c in dockerfile_copies(DOCKERFILE) for src in c.sources} | {".dockerignore"}:
        path = ROOT / source
        if path.is_dir():
            shutil.copytree(path, context / source, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, context / source, follow_symlinks=False)
    dockerfile = DOCKERFILE
    if fault == "COPY gateway":
        dockerfile = dockerfile.replace("COPY gateway ./gateway\n", "")
        assert dockerfile != DOCKERFILE
    elif fault == "include gateway*":
        (context / "pyproject.toml").write_text(_pyproject_without("gateway"))
    else:
        text = (context / "pyproject.toml").read_text()
        (context / "pyproject.toml").write_text(re.sub(r'\n    "structlog[^"]*",', "", text, count=1))
        assert (context / "pyproject.toml").read_text() != text
    return build_image_tree(tmp / "image", dockerfile=dockerfile, context=context)


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Future[ImageRun]]]:
    """The real image's build (key ``""``) and each fault's, all started at once (module docstring)."""
    with ThreadPoolExecutor(max_workers=1 + len(FAULTS)) as pool:
        futures = {"": pool.submit(build_image_tree, tmp_path_factory.mktemp("image"), dockerfile=DOCKERFILE)}
        for fault in FAULTS:
            futures[fault] = pool.submit(_mutated_build, tmp_path_factory.mktemp("mutant"), fault)
        yield futures


def test_the_images_file_set_runs_every_command(builds: dict[str, Future[ImageRun]]) -> None:
    run = builds[""].result()
    assert run.returncode == 0, run.output
    assert "usage: ptel" in run.output
    commands = re.search(r"^commands: (.*)$", run.output, re.MULTILINE)
    assert commands is not None, run.output
    # every command module of ptel/commands is registered (a new one cannot escape the check)
    modules = {p.stem.replace("_", "-") for p in (ROOT / "ptel" / "commands").glob("*.py")} - {"--init--", "options"}
    assert set(commands.group(1).split()) == modules


@pytest.mark.parametrize("fault", FAULTS)
def test_the_check_fails_on_a_missing_package(builds: dict[str, Future[ImageRun]], fault: str) -> None:
    """Mutations: the image without gateway/, the wheel without it, the dependencies without structlog."""
    run = builds[fault].result()
    assert run.returncode != 0, run.output
    missing = "structlog" if fault.startswith("dependency") else "gateway"
    assert f"No module named '{missing}'" in run.output, run.output


def test_the_dockerfile_parser_refuses_what_it_cannot_reproduce() -> None:
    for bad in ("ADD x ./x", "COPY --from=build /a ./a", "COPY *.toml ./", "WORKDIR /srv"):
        with pytest.raises(ValueError):
            dockerfile_copies(f"FROM python:3.11-slim\nCOPY a ./a\n{bad}\n")
    assert dockerfile_copies("COPY a \\\n  b ./\n") == [Copy(("a", "b"), "./")]


def test_the_image_has_a_non_root_user_and_a_healthcheck() -> None:
    lines = [line.strip() for line in re.sub(r"\\\n", " ", DOCKERFILE).splitlines()]
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and users[-1] not in {"root", "0"}, users
    (check,) = [line for line in lines if line.startswith("HEALTHCHECK ")]
    assert "PTEL_HEALTHCHECK_URL" in check and "--interval" in check
    # the default URL is the worker's metrics server (compose and deploy/ override it per service)
    assert "ENV PTEL_HEALTHCHECK_URL=http://127.0.0.1:9108/healthz" in lines
