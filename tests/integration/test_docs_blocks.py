"""Every code block of README.md, docs/*.md and clients/typescript/README.md is run by a test or says why not.

The line right before each fenced block is a marker, one of:

- ``<!-- docs: run -->``: run here, by its language: ``python`` executes as a script in a fresh folder (``HOME`` there,
  ``examples/`` the checkout's, ``127.0.0.1:9092`` the suite's broker), ``json``/``jsonl`` parse (the JSON lines of
  docs/wire-format.md decode as wire records), ``yaml`` loads;
- ``<!-- docs: commands -->``: a list of commands, each checked to exist with the flags it names: ``ptel SUB ...``
  (the sub-command and every ``--flag`` are ``ptel``'s), ``make TARGET`` (a Makefile target),
  ``.venv/bin/python -m MODULE ...`` (a module of the checkout whose source defines every ``--flag``), a script's
  path, ``npm run SCRIPT`` (a script of clients/typescript/package.json);
- ``<!-- docs: tested by PATH -->``: a test file that runs the block; it must exist and read this document;
- ``<!-- docs: not runnable: REASON -->``: a diagram, a synopsis of another tool, an excerpt; the reason says which.

A block without a marker fails here (the known-bad variant: a new example nobody runs).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from ptel.cli import build_parser
from schemas.wire import decode

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "clients" / "typescript" / "README.md"]
_FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
_MARKER = re.compile(r"^\s*<!-- docs: (run|commands|tested by (\S+)|not runnable: (.+)) -->\s*$")


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int  # 1-based line of the opening fence
    lang: str
    body: str
    marker: str | None  # the marker's text after "docs: ", or None

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


def blocks(doc: Path) -> list[Block]:
    lines = doc.read_text(encoding="utf-8").split("\n")
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not re.match(r"^\s*```\s*$", lines[j]):
            j += 1
        indent = len(m.group(1))
        body = "\n".join(line[indent:] for line in lines[i + 1 : j]) + "\n"
        marker = _MARKER.match(lines[i - 1]) if i > 0 else None
        out.append(Block(doc, i + 1, m.group(2), body, marker.group(1) if marker else None))
        i = j + 1
    return out


ALL = [b for doc in DOCUMENTS for b in blocks(doc)]
TESTED_ELSEWHERE = [b for b in ALL if b.marker and b.marker.startswith("tested by")]


def _where(block: Block) -> str:
    return block.where


def test_every_block_has_a_marker() -> None:
    assert len(ALL) >= 30
    missing = [b.where for b in ALL if b.marker is None]
    assert not missing, f"code blocks without a <!-- docs: ... --> marker on the line before: {missing}"


def test_the_marker_check_catches_an_unmarked_block(tmp_path: Path) -> None:
    doc = tmp_path / "x.md"
    doc.write_text("text\n\n```python\nprint(1)\n```\n\n<!-- docs: run -->\n```json\n{}\n```\n", encoding="utf-8")
    found = blocks(doc)
    assert [b.marker for b in found] == [None, "run"]


@pytest.mark.parametrize("block", TESTED_ELSEWHERE, ids=_where)
def test_the_named_test_reads_the_document(block: Block) -> None:
    m = _MARKER.match(f"<!-- docs: {block.marker} -->")
    assert m is not None
    test = ROOT / m.group(2)
    assert test.is_file(), f"{block.where}: {test} does not exist"
    assert block.doc.name in test.read_text(encoding="utf-8"), f"{test} does not read {block.doc.name}"


def _options(sub: str) -> set[str]:
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")  # the sub-command table
    choices: dict[str, object] = action.choices  # type: ignore[assignment]
    assert sub in choices, f"ptel has no sub-command {sub!r}"
    sub_parser = choices[sub]
    opts = {s for a in sub_parser._actions for s in a.option_strings}  # type: ignore[attr-defined]
    for a in sub_parser._actions:  # type: ignore[attr-defined]
        for nested in (a.choices or {}).values() if isinstance(a.choices, dict) else ():
            opts |= {s for na in nested._actions for s in na.option_strings}
    return opts


def _make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([A-Za-z][\w-]*):", text, re.M))


def _check_command(line: str) -> None:
    line = line.split("#", 1)[0].strip().rstrip("\\").strip()
    if not line or line.startswith("export "):
        return
    words = shlex.split(line.replace("[", " ").replace("]", " ").replace("|", " "))
    if words[0] == "ptel":
        opts = _options(words[1])
        flags = {w.split("=", 1)[0] for w in words[2:] if w.startswith("--")}
        assert flags <= opts, f"ptel {words[1]} has no {sorted(flags - opts)}"
    elif words[0] == "make":
        assert words[1] in _make_targets(), f"the Makefile has no target {words[1]}"
    elif words[0].endswith("python") and words[1:2] == ["-m"]:
        module = ROOT / (words[2].replace(".", "/") + ".py")
        assert module.is_file(), f"no module {words[2]}"
        source = module.read_text(encoding="utf-8")
        for flag in (w.split("=", 1)[0] for w in words[3:] if w.startswith("--")):
            assert f'"{flag}"' in source, f"{words[2]} has no {flag}"
    elif words[0].endswith("python"):
        assert (ROOT / words[1]).is_file(), f"no script {words[1]}"
    elif words[0] == "npm":
        package = json.loads((ROOT / "clients" / "typescript" / "package.json").read_text(encoding="utf-8"))
        if words[1] == "run":
            assert words[2] in package["scripts"], f"clients/typescript has no npm script {words[2]}"
        else:
            assert words[1] in {"ci", "test", "install", "pack"}, f"npm {words[1]}"
    else:
        raise AssertionError(f"no check for {words[0]!r} commands: mark the block otherwise")


@pytest.mark.parametrize("block", [b for b in ALL if b.marker == "commands"], ids=_where)
def test_listed_commands_exist_with_their_flags(block: Block) -> None:
    continued = ""
    for raw in block.body.splitlines():
        line = continued + raw
        if line.rstrip().endswith("\\"):
            continued = line.rstrip()[:-1] + " "
            continue
        continued = ""
        if line.startswith((" ", "\t")) and not line.strip().startswith(("ptel", "make", ".venv", "npm")):
            continue  # a continuation of the synopsis above
        try:
            _check_command(line)
        except AssertionError as err:
            raise AssertionError(f"{block.where}: {line.strip()!r}: {err}") from err


@pytest.mark.parametrize("block", [b for b in ALL if b.marker == "run"], ids=_where)
def test_runnable_blocks_run(block: Block, kafka_bootstrap: str, tmp_path: Path) -> None:
    if block.lang == "json" and block.doc.name == "wire-format.md":
        for line in block.body.splitlines():  # wire records in their JSON form: they decode
            decode(line.encode("utf-8"))
    elif block.lang == "json":
        json.loads(block.body)
    elif block.lang == "jsonl":
        for line in block.body.splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                json.loads(line)
    elif block.lang == "yaml":
        yaml.safe_load(block.body)
    elif block.lang == "python":
        (tmp_path / "examples").symlink_to(ROOT / "examples")
        (tmp_path / "home").mkdir(mode=0o700)
        script = tmp_path / "block.py"
        script.write_text(block.body.replace("127.0.0.1:9092", kafka_bootstrap), encoding="utf-8")
        env = {**os.environ, "HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
        done = subprocess.run(
            [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, f"{block.where}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    else:
        pytest.fail(f"{block.where}: no way to run a ```{block.lang} block here; mark it otherwise")
