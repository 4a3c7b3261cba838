"""The README and docs/ stay true: every relative link leads somewhere, every environment
variable they name exists, and docs/configuration.md documents every setting."""

from __future__ import annotations

import ast
import fnmatch
import json
import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

from claude_proxy.cli.launcher import CLAUDE_BIN_VARIABLE, claude_code_environment
from claude_proxy.config.file import RouterSettings, single_provider_config
from claude_proxy.config.model_table import FACT_KEYS
from claude_proxy.config.settings import Settings
from tests.claude_code_pin import default_claude_bin, environment
from tests.conftest import ProxyServer, SuiteRecord
from tests.scripted_upstream import ScriptedUpstream, completion, text_stream

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CONFIGURATION = ROOT / "docs" / "configuration.md"

PENDING_PAGES = frozenset({"several-processes.md", "context-windows.md", "keys-and-budgets.md",
                           "local-servers.md", "provider-dialects.md"})
"""Pages other branches of this round are writing; linked ahead of their arrival. Once a page
has landed it is checked like any other."""

PROXY_READS = {"OLLAMA_HOST": "src/claude_proxy/cli/command_line.py",
               "XDG_CONFIG_HOME": "src/claude_proxy/cli/desktop.py",
               "PROMETHEUS_MULTIPROC_DIR": "pyproject.toml",
               "ENV_FILE": "Makefile",
               "SOAK_SECONDS": "Makefile",
               "FUZZ_SECONDS": "Makefile",
               "SOAK_LOG_LEVEL": "tests/soak.py",
               "DASHBOARD_README_SHOT": "tests/test_dashboard_browser.py",
               "CLAUDE_BIN_NEWEST": "tests/claude_code_pin.py",
               # glibc reads them; the proxy leaves its allocator alone when they are set
               "MALLOC_TRIM_THRESHOLD": "src/claude_proxy/cli/command_line.py",
               "MALLOC_MMAP_THRESHOLD": "src/claude_proxy/cli/command_line.py",
               **{name: "tests/test_upstream_transport.py"  # httpx reads them for the upstream
                  for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY",
                               "SSL_CERT_FILE", "SSL_CERT_DIR")}}
"""Variables read outside Settings, and a file that shows it (the metrics library reads
PROMETHEUS_MULTIPROC_DIR itself: pyproject.toml names that library)."""
OTHER_PROGRAMS = {"CLAUDE_CODE_EFFORT_LEVEL": "Claude Code", "BUILDAH_FORMAT": "podman",
                  "CLAUDE_CODE_ENHANCED_TELEMETRY_BETA": "Claude Code",
                  "OLLAMA_CONTEXT_LENGTH": "Ollama",
                  "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "Claude Code",
                  "DISABLE_TELEMETRY": "Claude Code",
                  **{name: "Claude Code" for name in (  # its idle watchdogs
                      "CLAUDE_STREAM_IDLE_TIMEOUT_MS", "CLAUDE_BYTE_STREAM_IDLE_TIMEOUT_MS",
                      "CLAUDE_ENABLE_BYTE_WATCHDOG", "CLAUDE_ENABLE_STREAM_WATCHDOG")}}
USER_CHOSEN = {"KIMI_API_KEY", "DEEPSEEK_API_KEY", "OPENROUTER_API_KEY", "DEEPSEEK_CHAT",
               "ALICE_PROXY_KEY", "LANGFUSE_AUTH"}
"""Names the reader chooses (a secret read with `env:NAME`, a tool-group NAME)."""
PREFIX_FAMILIES = ("TOOL_GROUPS_DISABLED_", "TOOL_GROUP_")

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
VARIABLE = re.compile(r"\b[A-Z][A-Z0-9]+(?:_(?:[A-Z0-9]+|\*|<[A-Za-z]+>))+")


def settings_variables() -> set[str]:
    return {name.upper() for name in Settings.model_fields}


def launcher_variables() -> set[str]:
    config = single_provider_config(Settings(openai_api_key="k", provider="openai"))
    return {*claude_code_environment(config, "127.0.0.1", 8082), "CLAUDE_CODE_SUBAGENT_MODEL",
            "CLAUDE_CODE_MAX_CONTEXT_TOKENS", CLAUDE_BIN_VARIABLE}


def opentelemetry_variables() -> set[str]:
    """The OTEL_ variables the SDK reads (its own list of them) and those telemetry/ reads."""
    from opentelemetry import environment_variables as api
    from opentelemetry.sdk import environment_variables as sdk_variables

    sdk = {name for module in (api, sdk_variables) for name in dir(module)
           if name.startswith("OTEL_")}
    ours = {name for path in (ROOT / "src" / "claude_proxy" / "telemetry").glob("*.py")
            for name in re.findall(r"OTEL_[A-Z0-9_]+", path.read_text(encoding="utf-8"))}
    return sdk | ours


def known_variables() -> set[str]:
    return (settings_variables() | launcher_variables() | set(PROXY_READS)
            | set(OTHER_PROGRAMS) | USER_CHOSEN | opentelemetry_variables())


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = page.read_text(encoding="utf-8")
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return {slug(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_leads_somewhere(page: Path) -> None:
    broken = []
    prose = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.M | re.S)
    for target in LINK.findall(re.sub(r"`[^`]*`", "", prose)):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, fragment = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        if not where.exists():
            if where.name not in PENDING_PAGES or where.parent != ROOT / "docs":
                broken.append(target)
            continue
        if fragment and where.suffix == ".md" and fragment not in anchors(where):
            broken.append(target)
    assert broken == []


def test_the_pending_pages_are_linked_from_the_front_page_and_the_reference() -> None:
    for page in (ROOT / "README.md", CONFIGURATION):
        text = page.read_text(encoding="utf-8")
        assert [name for name in sorted(PENDING_PAGES) if name not in text] == []


def documented_variables(page: Path) -> set[str]:
    return set(VARIABLE.findall(page.read_text(encoding="utf-8")))


def is_known(name: str, known: set[str]) -> bool:
    if name.startswith(PREFIX_FAMILIES):
        return True
    pattern = re.sub(r"<[A-Za-z]+>", "*", name)
    return any(fnmatch.fnmatchcase(candidate, pattern) for candidate in known)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_variable_named_is_real(page: Path) -> None:
    known = known_variables()
    assert sorted(name for name in documented_variables(page) if not is_known(name, known)) == []


def test_the_variables_read_outside_settings_are_read_there() -> None:
    for name, where in PROXY_READS.items():
        text = (ROOT / where).read_text(encoding="utf-8")
        assert (name in text if where != "pyproject.toml" else "prometheus-client" in text)


def test_configuration_documents_every_setting() -> None:
    text = CONFIGURATION.read_text(encoding="utf-8")
    spelled = {"tool_groups_disabled": "TOOL_GROUPS_DISABLED_<NAME>",
               "tool_group_patterns": "TOOL_GROUP_<NAME>"}
    missing = [name for name in Settings.model_fields
               if f"`{spelled.get(name, name.upper())}" not in text
               and f"`{name}`" not in text]
    missing += [f"[router] {name}" for name in RouterSettings.model_fields
                if f"`{name}`" not in text]
    missing += [f"model key {name}" for name in FACT_KEYS if f"`{name}`" not in text]
    assert missing == []


CLAUDE_BIN = default_claude_bin()


@pytest.mark.skipif(not CLAUDE_BIN.is_file(),
                    reason="Claude Code not installed (make test installs it)")
def test_claude_codes_variables_are_claude_codes() -> None:
    """Every Claude Code variable the docs name (and the launcher sets) is in its binary."""
    names = {name for page in PAGES for name in documented_variables(page)
             if name.startswith(("CLAUDE_CODE_", "ANTHROPIC_")) and "*" not in name
             and name.upper().lower() not in Settings.model_fields}
    names |= launcher_variables() - {CLAUDE_BIN_VARIABLE}
    binary = CLAUDE_BIN
    wanted = {name.encode() for name in names}
    found: set[bytes] = set()
    tail = b""
    with binary.open("rb") as stream:
        while wanted - found and (piece := stream.read(1 << 24)):
            window = tail + piece
            found |= {name for name in wanted - found if name in window}
            tail = window[-64:]
    assert sorted(name.decode() for name in wanted - found) == []


def test_every_docs_page_is_linked_from_the_front_page() -> None:
    """No orphan page: each docs/*.md is reachable from README.md."""
    front = (ROOT / "README.md").read_text(encoding="utf-8")
    orphans = [page.name for page in sorted((ROOT / "docs").glob("*.md"))
               if f"(docs/{page.name}" not in front]
    assert orphans == []


def layout_entries() -> list[str]:
    """The names the Layout block of docs/development.md lists under src/claude_proxy/."""
    text = (ROOT / "docs" / "development.md").read_text(encoding="utf-8")
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    return [line.split()[0].rstrip("/") for line in block.splitlines()
            if line.startswith("  ") and line.split()]


def layer_order() -> list[str]:
    """The top-level packages and modules in the order of the layers contract, top first."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in contracts["contracts"] if c["id"] == "layers")["layers"]
    return [name.strip() for layer in layers for name in re.split(r"[|:]", layer)]


def test_the_layout_lists_every_package_in_the_order_of_the_layers() -> None:
    """One line per package or top-level module, none missing, none stale, in the order the
    import contract checks (so the page shows the request's path as the code has it)."""
    source = ROOT / "src" / "claude_proxy"
    present = {path.stem for path in source.iterdir()
               if (path.is_dir() and (path / "__init__.py").exists())
               or (path.suffix == ".py" and path.stem not in ("__init__", "__main__"))}
    listed = [name.removesuffix(".py") for name in layout_entries()]
    assert sorted(listed) == sorted(present)
    assert listed == layer_order()


FIRST_PARTY = ("claude_proxy", "tests", "bench")


def private_imports(path: Path) -> list[str]:
    """`module name` for each private name (or private module) of the project that `path`
    imports from another module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
                node.module.split(".")[0] in FIRST_PARTY):
            parts = node.module.split(".")
            names = [alias.name for alias in node.names]
            found += [f"{node.module} {name}" for name in [*parts, *names]
                      if name.startswith("_") and not name.startswith("__")]
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names
                      if alias.name.split(".")[0] in FIRST_PARTY and any(
                          part.startswith("_") and not part.startswith("__")
                          for part in alias.name.split("."))]
    return found


def test_no_private_name_is_imported_across_modules() -> None:
    """The house rule of docs/development.md, over the source, the tests and the bench."""
    files = [path for folder in ("src", "tests", "bench")
             for path in sorted((ROOT / folder).rglob("*.py"))
             if "node_modules" not in path.parts]
    assert len(files) > 100
    found = {str(path.relative_to(ROOT)): private_imports(path) for path in files}
    assert {path: names for path, names in found.items() if names} == {}


MAX_CLASS_LINES = 300


def long_classes(path: Path) -> list[str]:
    """`Class: lines` for each class of `path` longer than the house allows."""
    return [f"{node.name}: {node.end_lineno - node.lineno + 1} lines"
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None
            and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES]


def test_no_class_is_longer_than_the_house_allows() -> None:
    """No class over 300 lines (docs/development.md): a longer one has a seam to split at."""
    files = sorted((ROOT / "src").rglob("*.py"))
    assert len(files) > 100
    found = {str(path.relative_to(ROOT)): long_classes(path) for path in files}
    assert {path: names for path, names in found.items() if names} == {}


# ---------------------------------------------------------------- the README's snippets, run

README = ROOT / "README.md"
DOCUMENTED_ADDRESS = "http://127.0.0.1:8082"


def readme_snippet(opening: str) -> str:
    """The README's bash block that begins with `opening`."""
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL)
    found = [block for block in blocks if block.startswith(opening)]
    assert len(found) == 1, blocks
    return found[0]


def at(snippet: str, proxy: ProxyServer) -> str:
    """The snippet with the documented address replaced by the test proxy's, nothing else."""
    assert snippet.count(DOCUMENTED_ADDRESS) == 1, snippet
    return snippet.replace(DOCUMENTED_ADDRESS, proxy.url)


def test_the_readme_curl_request_runs_as_written(proxy: ProxyServer,
                                                 upstream: ScriptedUpstream) -> None:
    upstream.queue(completion({"content": "Hi from the upstream"}))
    result = subprocess.run(["bash", "-c", at(readme_snippet("curl "), proxy)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    message = json.loads(result.stdout)
    assert (message["type"], message["role"], message["model"]) == (
        "message", "assistant", "claude-sonnet-4-6")
    assert message["content"] == [{"type": "text", "text": "Hi from the upstream"}]
    assert upstream.requests[0]["messages"] == [{"role": "user", "content": "Say hi"}]


@pytest.mark.claude_code
def test_the_readme_base_url_line_runs_claude_code_as_written(
        tmp_path: Path, proxy: ProxyServer, upstream: ScriptedUpstream) -> None:
    """`claude` found on PATH, as a user would have it; only `-p` added to run it once."""
    binary = default_claude_bin()
    if not os.access(binary, os.X_OK):
        pytest.skip("Claude Code not installed (make test installs it)")
    upstream.queue(text_stream(["pong by base URL"]))
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    tmp.mkdir()
    env = environment(proxy.url, home, tmp)
    for name in ("ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY"):
        del env[name]  # the snippet sets what Claude Code needs
    env["PATH"] = f"{binary.parent}{os.pathsep}{env['PATH']}"
    command = at(readme_snippet("ANTHROPIC_BASE_URL="), proxy).strip()
    result = subprocess.run(["bash", "-c", f"{command} -p 'say pong' --output-format json"],
                            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120,
                            stdin=subprocess.DEVNULL)
    assert json.loads(result.stdout)["result"] == "pong by base URL", result.stderr
    sent = [headers for path, headers in SuiteRecord.requests if path == "/v1/messages"]
    assert sent[-1]["authorization"] == "Bearer claude-proxy"
