"""`claude-proxy desktop`: Claude Desktop's third-party gateway mode pointed at this proxy.

Claude Desktop (Cowork and Code tabs) can send its inference to a gateway that speaks the
Messages API. Its local configuration is a directory, `Claude-3p/configLibrary/`: `_meta.json`
records which saved configuration is applied, and each configuration is a `<id>.json` file
beside it, with the documented keys at its top level (claude.com/docs/cowork/3p/configuration,
"How keys are read"; the keys: claude.com/docs/cowork/3p/gateway). The command writes one such
configuration, `claude-proxy`, and applies it:

- `inferenceProvider: "gateway"`; `inferenceGatewayBaseUrl`: this proxy, without a path
  (Desktop adds `/v1/messages` and `/v1/models` itself); `inferenceGatewayApiKey`: the proxy's
  client key, or a placeholder when it requires none (Desktop refuses an empty key);
  `inferenceGatewayAuthScheme: "bearer"`;
- `inferenceModels`: the proxy's route ids, each with the Claude tier it stands in for
  (`anthropicFamilyTier`, `isFamilyDefault`), the main route first (Desktop's default).

Before the first write it keeps a copy of what was there (once: a later run leaves that copy
alone), and `--restore` puts it back. `--print` only shows what would be written. What it
prints never holds the key in full.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from claude_proxy.cli.launcher import base_url_of, client_key
from claude_proxy.config.file import ConfigurationError, ProxyConfig
from claude_proxy.routing.catalog import family_defaults, family_tier
from claude_proxy.routing.router import Router

PROFILE_NAME = "claude-proxy"
PROFILE_ID = str(uuid.uuid5(uuid.NAMESPACE_URL, "https://github.com/claude-proxy/desktop"))
"""The same id on every machine and run, so that a second run replaces its own profile."""
META = "_meta.json"
BACKUP = "claude-proxy-backup"
"""Beside configLibrary (not in it: Desktop reads that directory)."""
MANIFEST = "manifest.json"


def library_directory(platform: str, environ: Mapping[str, str], home: Path) -> Path:
    """Where Claude Desktop reads its local third-party configuration: macOS
    `~/Library/Application Support/Claude-3p/configLibrary`, Windows
    `%LOCALAPPDATA%\\Claude-3p\\configLibrary`, elsewhere under the user's configuration
    directory (`$XDG_CONFIG_HOME`, else `~/.config`)."""
    if platform == "darwin":
        root = home / "Library" / "Application Support"
    elif platform == "win32":
        root = Path(environ.get("LOCALAPPDATA") or home / "AppData" / "Local")
    else:
        root = Path(environ.get("XDG_CONFIG_HOME") or home / ".config")
    return root / "Claude-3p" / "configLibrary"


def desktop_configuration(config: ProxyConfig, host: str, port: int) -> dict[str, Any]:
    """The configuration Desktop is given, with its own key names."""
    router = Router(config.providers, config.router)
    ids = router.route_ids()
    defaults = family_defaults(router, ids)
    return {"inferenceProvider": "gateway",
            "inferenceGatewayBaseUrl": base_url_of(host, port),
            "inferenceGatewayApiKey": client_key(config),
            "inferenceGatewayAuthScheme": "bearer",
            "inferenceModels": [{"name": model_id,
                                 "anthropicFamilyTier": family_tier(router, model_id),
                                 "isFamilyDefault": model_id in defaults}
                                for model_id in ids]}


def masked(configuration: Mapping[str, Any]) -> dict[str, Any]:
    """The configuration as printed: the key's first four characters at most."""
    key = str(configuration.get("inferenceGatewayApiKey", ""))
    start = key[:4] if len(key) >= 12 else ""
    shown = f"{start}… ({len(key)} characters)"
    return {**configuration, "inferenceGatewayApiKey": shown}


def applied_meta(library: Path) -> dict[str, Any]:
    """`_meta.json` with this profile listed and applied; other saved configurations kept."""
    meta: dict[str, Any] = {}
    path = library / META
    if path.is_file():
        try:
            found = json.loads(path.read_text(encoding="utf-8"))
            meta = found if isinstance(found, dict) else {}
        except ValueError:
            meta = {}
    entries = [entry for entry in meta.get("entries") or []
               if isinstance(entry, dict) and entry.get("id") != PROFILE_ID]
    return {**meta, "appliedId": PROFILE_ID,
            "entries": [*entries, {"id": PROFILE_ID, "name": PROFILE_NAME}]}


def keep_copy(library: Path) -> Path:
    """The files this command changes, copied once to the backup folder beside the library
    (with a manifest of which existed); an existing copy is left as it is."""
    backup = library.parent / BACKUP
    if (backup / MANIFEST).is_file():
        return backup
    backup.mkdir(parents=True, exist_ok=True)
    existed: dict[str, bool] = {}
    for name in (META, f"{PROFILE_ID}.json"):
        source = library / name
        existed[name] = source.is_file()
        if existed[name]:
            shutil.copy2(source, backup / name)
    (backup / MANIFEST).write_text(json.dumps({"files": existed}, indent=1) + "\n",
                                   encoding="utf-8")
    return backup


def write_configuration(library: Path, configuration: Mapping[str, Any]) -> list[Path]:
    """The profile and `_meta.json`, the profile owner-only (it holds the key)."""
    library.mkdir(parents=True, exist_ok=True)
    profile = library / f"{PROFILE_ID}.json"
    meta = applied_meta(library)
    write_private(profile, json.dumps(configuration, indent=2) + "\n")
    (library / META).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return [profile, library / META]


def write_private(path: Path, text: str) -> None:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as stream:
        stream.write(text)
    os.chmod(path, 0o600)


def restore(library: Path) -> list[str]:
    """Put back what the first run found: each file copied back, or removed when there was
    none; then the copy is dropped. What was done, one line each."""
    backup = library.parent / BACKUP
    manifest = backup / MANIFEST
    if not manifest.is_file():
        raise ConfigurationError(f"nothing to restore: no copy at {backup}")
    existed: dict[str, bool] = json.loads(manifest.read_text(encoding="utf-8"))["files"]
    done = []
    for name, was_there in existed.items():
        target = library / name
        if was_there:
            shutil.copy2(backup / name, target)
            done.append(f"restored {target}")
        elif target.exists():
            target.unlink()
            done.append(f"removed {target}")
    shutil.rmtree(backup)
    return done


def run_desktop(config: ProxyConfig, host: str, port: int, restore_it: bool = False,
                print_only: bool = False, platform: str = sys.platform,
                environ: Mapping[str, str] | None = None, home: Path | None = None) -> int:
    """The `desktop` command; prints what it wrote (or would write), the key masked."""
    library = library_directory(platform, os.environ if environ is None else environ,
                                Path.home() if home is None else home)
    if restore_it:
        for line in restore(library):
            print(line)
        print("Quit and reopen Claude Desktop: it reads its configuration at launch.")
        return 0
    configuration = desktop_configuration(config, host, port)
    shown = json.dumps(masked(configuration), indent=2, ensure_ascii=False)
    if print_only:
        print(f"would write {library / f'{PROFILE_ID}.json'} (and apply it in {META}):")
        print(shown)
        return 0
    backup = keep_copy(library)
    for path in write_configuration(library, configuration):
        print(f"wrote {path}")
    print(shown)
    print(f"The earlier configuration is kept in {backup}: `claude-proxy desktop --restore` "
          "puts it back.\nQuit and reopen Claude Desktop: it reads its configuration at "
          "launch; the proxy must be running at "
          f"{configuration['inferenceGatewayBaseUrl']}.")
    return 0
