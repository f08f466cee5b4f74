"""Every command and example in the Markdown docs works as written.

Each code block in a tracked .md file is fenced and names its language; shell blocks are run
or, when they need more than this machine offers, checked without running. The words after
the language say which:

    ```sh                 run here, in a copy of the repository (file by file, blocks in order)
    ```sh root            changes the machine (installs, systemd): checked, not run
    ```sh node            reads a real GPU node or a running exporter: checked, not run
    ```sh long            runs for minutes (demo, benchmarks, the suite itself): checked, not run
    ```sh template        has placeholders to fill in: checked, not run
    ```yaml KIND [file=NAME]   parsed, and KIND's own checker run (below); file= writes it into the copy
                          (KIND policy: the remediation service's policy file)
    ```promql             each line parsed by promtool
    ```text output        right after a run block: what the block printed, line for line
    ```text / ```ini      shown as it is

"Checked" means: bash parses it, every `gpunode-exporter` command line parses with the real
argument parser, every `make` target exists, and every path into the repository it names
exists in the copy (globs must match). PromQL written inline in the docs (`rate(x[5m]) > 0`) is parsed by
promtool too.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from markdown_it import MarkdownIt

from gpunode_common import webconfig
from gpunode_exporter import cli, config
from gpunode_remediate import cli as remediate_cli
from gpunode_remediate import policy as policies
from gpunode_rulepack import load_spec, render
from tests import tlscerts
from tests.helpers import MINIMAL_DEBIAN, copy_tracked_files, free_port, install_deps_tools

ROOT = Path(__file__).resolve().parent.parent
LANGUAGES = {"sh", "yaml", "promql", "text", "ini", "json"}
NOT_RUN = {"root", "node", "long", "template"}
YAML_KINDS = {"prometheus", "alertmanager", "config", "web-config", "rule-spec", "schema", "policy"}
_MD = MarkdownIt("commonmark").enable("table")


@dataclass(frozen=True)
class Block:
    file: str
    line: int
    language: str
    words: tuple[str, ...]
    text: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


def _markdown_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True)
    # Fixture READMEs describe test data; generated result pages hold no commands.
    return [f for f in out.stdout.split() if not f.startswith("tests/fixtures/")]


def _blocks(file: str) -> list[Block]:
    tokens = _MD.parse((ROOT / file).read_text())
    found = []
    for token in tokens:
        if token.type in ("fence", "code_block"):
            language, *words = token.info.split() or [""]
            found.append(Block(file, token.map[0] + 1, language, tuple(words), token.content))
    return found


BLOCKS = [b for f in _markdown_files() for b in _blocks(f)]
FILES_TO_RUN = sorted({b.file for b in BLOCKS if b.language == "sh" and not NOT_RUN & set(b.words)})


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not installed: run scripts/install-deps.sh --test")
    return path


def test_every_code_block_names_its_language() -> None:
    unlabelled = [f"{b} ({b.language or 'indented' if not b.language else b.language})" for b in BLOCKS
                  if b.language not in LANGUAGES]
    assert not unlabelled, f"fence these with one of {sorted(LANGUAGES)}: {unlabelled}"
    for b in BLOCKS:
        if b.language == "sh":
            assert set(b.words) <= NOT_RUN, f"{b}: unknown words {b.words}"
        if b.language == "text":
            assert set(b.words) <= {"output"}, f"{b}: unknown words {b.words}"
        if b.language == "yaml":
            kinds = [w for w in b.words if not w.startswith("file=")]
            assert len(kinds) == 1 and kinds[0] in YAML_KINDS, f"{b}: say which kind of YAML: {sorted(YAML_KINDS)}"


# --- shell ------------------------------------------------------------------------------------

def _commands(text: str) -> list[list[str]]:
    """The simple commands of a script, split on pipes, && and ;, without comments."""
    joined = re.sub(r"\\\n", " ", text)
    commands = []
    for line in joined.splitlines():
        if "<<" in line:  # a here-document's body is data
            break
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        current: list[str] = []
        for word in [*words, ";"]:
            if word in ("|", "||", "&&", ";", "&"):
                if current:
                    commands.append(current)
                current = []
            else:
                current.append(word)
    return commands


def _check_statically(block: Block, copy: Path) -> None:
    syntax = subprocess.run(["bash", "-n"], input=block.text, capture_output=True, text=True)
    assert syntax.returncode == 0, f"{block}: {syntax.stderr}"
    targets = set(re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), re.MULTILINE))
    for words in _commands(block.text):
        program = Path(words[0]).name
        if program == "gpunode-exporter":
            args = [w for w in words[1:] if not w.startswith(">")]
            try:
                cli.parse_args(args)
            except SystemExit as exit:
                assert exit.code == 0, f"{block}: gpunode-exporter does not take {shlex.join(args)}"
        if program == "gpunode-remediate":
            args = [w for w in words[1:] if not w.startswith(">")]
            try:
                remediate_cli.build_parser().parse_args(args)
            except SystemExit as exit:
                assert exit.code == 0, f"{block}: gpunode-remediate does not take {shlex.join(args)}"
        if program == "make":
            assert set(words[1:]) <= targets | {w for w in words[1:] if "=" in w}, f"{block}: no make target {words}"
        for word in words:
            # A path in the repository (or made by an earlier block): its first part is there.
            if "/" in word and (copy / word.split("/")[0]).exists() and word.split("/")[0] not in ("", ".") \
                    and not any(c in word for c in "=:$()"):
                matches = list(copy.glob(word)) if any(c in word for c in "*?[") else [copy / word]
                assert any(m.exists() for m in matches), f"{block}: {word} does not exist"


@pytest.fixture(scope="module")
def copies(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One copy of the tracked files per Markdown file, with the test environment's .venv."""
    made: dict[str, Path] = {}

    def copy_for(file: str) -> Path:
        if file not in made:
            dest = copy_tracked_files(tmp_path_factory.mktemp(file.replace("/", "_")))
            (dest / ".venv").symlink_to(Path(sys.prefix))
            made[file] = dest
        return made[file]

    return copy_for  # type: ignore[return-value]


@pytest.mark.parametrize("file", sorted({b.file for b in BLOCKS}))
def test_shell_blocks_work_as_written(file: str, copies) -> None:
    copy = copies(file)
    env = {**os.environ, "PATH": f"{copy / '.venv' / 'bin'}:{os.environ['PATH']}", "HOME": str(copy)}
    blocks = [b for b in BLOCKS if b.file == file]
    for i, block in enumerate(blocks):
        if block.language == "yaml" and any(w.startswith("file=") for w in block.words):
            name = next(w for w in block.words if w.startswith("file="))[len("file="):]
            (copy / name).write_text(block.text)
        if block.language != "sh":
            continue
        if not NOT_RUN & set(block.words):
            try:
                # The default port as the docs show it; here one no other server holds.
                script = block.text.replace(":19835", f":{free_port()}")
                done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=copy, env=env,
                                      capture_output=True, text=True, timeout=180)
            except subprocess.TimeoutExpired:
                pytest.fail(f"{block}: still running after 180 s")
            assert done.returncode == 0, \
                f"{block}: exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
            assert done.stdout.strip() or block.text.rstrip().endswith(("&", "done")), f"{block}: printed nothing"
            following = blocks[i + 1] if i + 1 < len(blocks) else None
            if following and following.words == ("output",):
                assert following.text.strip() == done.stdout.strip(), \
                    f"{block}: printed\n{done.stdout}\nwhere the doc shows\n{following.text}"
        _check_statically(block, copy)


# --- YAML -------------------------------------------------------------------------------------

def _check_yaml(block: Block, tmp: Path) -> None:
    kind = next(w for w in block.words if not w.startswith("file="))
    data = yaml.safe_load(block.text)
    path = tmp / "block.yml"
    path.write_text(block.text)
    if kind == "prometheus" and "kubernetes_sd_configs" in data.get("scrape_configs", [{}])[0]:
        # Debian builds Prometheus without Kubernetes discovery; vmagent parses the same format strictly.
        out = subprocess.run([_tool("vmagent"), f"-promscrape.config={path}", "-dryRun", "-loggerLevel=ERROR"],
                             capture_output=True, text=True)
        assert out.returncode == 0, f"{block}: {out.stdout}{out.stderr}"
    elif kind == "prometheus":
        out = subprocess.run([_tool("promtool"), "check", "config", "--syntax-only", str(path)],
                             capture_output=True, text=True)
        assert out.returncode == 0, f"{block}: {out.stdout}{out.stderr}"
    elif kind == "alertmanager":
        out = subprocess.run([_tool("amtool"), "check-config", str(path)], capture_output=True, text=True)
        assert out.returncode == 0, f"{block}: {out.stdout}{out.stderr}"
    elif kind == "config":
        config.load(path)
    elif kind == "web-config":
        tlscerts.make(tmp)
        webconfig.load(path)
    elif kind == "rule-spec":
        render(load_spec(path), "prometheus")
    elif kind == "policy":
        policies.load(path)
    else:  # schema: an annotated description of a format, with ... where anything goes
        assert isinstance(data, dict), f"{block}: not a mapping"


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.language == "yaml"], ids=str)
def test_yaml_blocks_are_valid(block: Block, tmp_path: Path) -> None:
    _check_yaml(block, tmp_path)


# --- PromQL -----------------------------------------------------------------------------------

_SAMPLE = re.compile(r"^[a-zA-Z_:][\w:]*(\{[^}]*\})? -?\d+(\.\d+)?$")  # exposition text, not a query
_QUERYLIKE = re.compile(r'[=~!]"|\[\d+[smhdw]\]|\s(==|!=|<=|>=|<|>)\s|^\w+\(.+\)$')
_METRIC = re.compile(r"\b(gpunode[_:]\w+|node_\w+|DCGM_\w+|up)\b")


def _inline_queries() -> list[tuple[str, str]]:
    found = []
    for file in _markdown_files():
        for token in _MD.parse((ROOT / file).read_text()):
            for child in token.children or []:
                text = child.content
                if child.type != "code_inline" or not (_QUERYLIKE.search(text) and _METRIC.search(text)) \
                        or _SAMPLE.match(text):
                    continue
                if text.startswith(("curl ", "grep ")) or ": '" in text or '"|"' in text:
                    continue  # a command, a YAML line, or label values written as alternatives
                found.append((file, text))
    for block in BLOCKS:
        if block.language == "promql":
            found += [(str(block), line) for line in block.text.splitlines() if line.strip()]
    return found


def test_promql_in_the_docs_parses() -> None:
    queries = _inline_queries()
    assert len(queries) > 50, "the inline-query scan found too little: is it still looking?"
    rules = {"groups": [{"name": "docs", "rules": [{"record": f"docs:query_{i}", "expr": q}
                                                   for i, (_f, q) in enumerate(queries)]}]}
    out = subprocess.run([_tool("promtool"), "check", "rules", "/dev/stdin"], input=yaml.safe_dump(rules),
                         capture_output=True, text=True)
    if out.returncode != 0:
        bad = []
        for file, query in queries:
            one = {"groups": [{"name": "q", "rules": [{"record": "docs:q", "expr": query}]}]}
            check = subprocess.run([_tool("promtool"), "check", "rules", "/dev/stdin"], input=yaml.safe_dump(one),
                                   capture_output=True, text=True)
            if check.returncode != 0:
                bad.append(f"{file}: {query}")
        pytest.fail("PromQL that does not parse:\n" + "\n".join(bad))


# --- product text -----------------------------------------------------------------------------

def _tracked_text() -> dict[str, str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    texts = {}
    for name in out.decode().split("\0"):
        path = ROOT / name
        if name and path.is_file() and not name.startswith("benchmarks/results/"):  # measured data, kept as run
            try:
                texts[name] = path.read_text()
            except UnicodeDecodeError:
                continue  # binary fixtures
    return texts


_PRIVATE = re.compile(r"seed 0\d\d|\bthe brief\b|BRIEF\.md|CONTRACT\.md|\bissues? #?\d+", re.IGNORECASE)
_REPOSITORY = re.compile(r"[\w.-]+/[\w.-]+ $|github\.com")  # "prometheus/procfs issue #166" is a citation
_TABLE = re.compile(r"\b(Table|Figure|Fig\.) ?\d+")
_SOURCES = ("Lablup", "report", "Minder", "FALCON", "NVIDIA", "Young", "Daly", "Llama 3", "ByteRobust")


def test_product_text_uses_no_private_names() -> None:
    """Names only the team knew (its source list, its issue numbers) mean nothing to a user."""
    found = []
    for name, text in _tracked_text().items():
        if name == "tests/test_docs.py":
            continue
        for match in _PRIVATE.finditer(text):
            if not _REPOSITORY.search(text[max(0, match.start() - 40):match.start()]):
                found.append(f"{name}: {match.group(0)}")
    assert not found, found


def test_tables_and_figures_name_their_source() -> None:
    """"Table 13" alone cannot be looked up: the source is named within the sentences before it."""
    found = []
    for name, text in _tracked_text().items():
        for match in _TABLE.finditer(text):
            if name != "tests/test_docs.py" and not any(s in text[max(0, match.start() - 300):match.start()]
                                                        for s in _SOURCES):
                found.append(f"{name}: {text[max(0, match.start() - 60):match.end()]!r}")
    assert not found, found


def test_flag_defaults_in_prose_are_the_parsers() -> None:
    parser, _args = cli.parse_args([])
    (commands,) = [a for a in parser._actions if a.dest == "command"]
    flags = commands.choices["serve"]._option_string_actions
    said = [(f, m) for f in _markdown_files()
            for m in re.finditer(r"`--([\w.-]+)` \(default `([^`]+)`\)", (ROOT / f).read_text())]
    assert said, "no `--flag` (default `value`) left to check: drop this test or the scan is broken"
    for file, match in said:
        default = flags[f"--{match.group(1)}"].default
        assert str(default) == match.group(2), f"{file}: --{match.group(1)} defaults to {default}, not {match.group(2)}"


def test_one_spelling_for_each_term() -> None:
    """NVIDIA writes "Xid"; "utilization" as Prometheus and NVML do. NVIDIA's catalog data keeps its own."""
    data = ("scripts/xid_catalog.py", "tests/test_xid_catalog.py", "tests/fixtures/", "tests/test_docs.py")
    found = [f"{name}: {m.group(0)}" for name, text in _tracked_text().items() if not name.startswith(data)
             for m in re.finditer(r"\bXIDs?\b|[Uu]tilis", text)]
    assert not found, found


def test_install_names_the_packages_pip_fetches_and_the_systems_python() -> None:
    """docs/install.md: the dependencies it lists are the wheel's (pyproject), and the venv the
    unit runs is made with /usr/bin/python3, which ProtectHome does not hide."""
    import tomllib

    text = (ROOT / "docs" / "install.md").read_text()
    listed = re.search(r"pip fetches its dependencies \(([^)]*)\)", text)
    assert listed, "docs/install.md no longer says what pip fetches"
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]

    def norm(name: str) -> str:
        return re.split(r"[<>=!~ \[]", name.strip())[0].lower().replace("_", "-")
    assert sorted(map(norm, listed.group(1).split(","))) == sorted(map(norm, declared))
    assert "/usr/bin/python3 -m venv /opt/gpunode-exporter" in text


# --- what a fresh machine installs ------------------------------------------------------------

VENV = {"gpunode-exporter", "gpunode-remediate", "pip", "python"}
ALTERNATIVES = {"node_exporter"}  # upstream's name, tried after Debian's prometheus-node-exporter


def test_the_readme_names_what_install_deps_installs() -> None:
    readme = (ROOT / "README.md").read_text()
    sentence = re.search(r"they install, where missing, Debian's (.*?)\n\n", readme, re.DOTALL)
    assert sentence, "README.md no longer lists the Debian packages the make targets install"
    named = set(re.findall(r"`([a-z0-9.-]+)`", sentence.group(1)))
    assert named == set(install_deps_tools().values()) | {"python3-venv"}


def test_install_deps_brings_every_program_the_tests_and_documented_commands_run() -> None:
    """On a minimal Debian, a program missing from install-deps.sh fails a test or a documented
    command the first time: found by name in the code the tests run and the docs' run blocks."""
    called = {Path(words[0]).name for b in BLOCKS if b.language == "sh" and not NOT_RUN & set(b.words)
              for words in _commands(b.text)}
    call = re.compile(r'(?:run|Popen|check_output|check_call)\(\s*\[\s*"([a-z][a-z0-9_.-]*)"'
                      r'|(?:which|_tool)\("([a-z][a-z0-9_.-]*)"\)')
    for path in [*ROOT.glob("tests/*.py"), *ROOT.glob("demo/*.py"), *ROOT.glob("fleet/*.py")]:
        called |= {a or b for a, b in call.findall(path.read_text())}
    assert {"curl", "promtool", "ip", "setpriv"} <= called  # the scan still finds programs
    assert called - set(install_deps_tools()) - MINIMAL_DEBIAN - VENV - ALTERNATIVES == set()
