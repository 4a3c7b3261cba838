#!/usr/bin/env python3
"""A stand-in for the `claude` binary: records what the launcher gave it, then exits.

Writes JSON to $STANDIN_DUMP: its arguments, its environment, and what the proxy at
$ANTHROPIC_BASE_URL answered on /health?detail=1 with the key it was given (status and body),
so a test can tell which process served the session. Exits with $STANDIN_EXIT (default 0).
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request


def proxy_detail() -> dict[str, object]:
    request = urllib.request.Request(
        os.environ["ANTHROPIC_BASE_URL"] + "/health?detail=1",
        headers={"authorization": "Bearer " + os.environ.get("ANTHROPIC_AUTH_TOKEN", "")})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return {"status": response.status, "body": json.loads(response.read())}
    except urllib.error.HTTPError as error:
        return {"status": error.code, "body": None}
    except OSError as error:
        return {"status": 0, "body": str(error)}


def main() -> int:
    record = {"argv": sys.argv[1:], "env": dict(os.environ), "proxy": proxy_detail()}
    with open(os.environ["STANDIN_DUMP"], "w", encoding="utf-8") as dump:
        json.dump(record, dump)
    return int(os.environ.get("STANDIN_EXIT", "0"))


if __name__ == "__main__":
    sys.exit(main())
