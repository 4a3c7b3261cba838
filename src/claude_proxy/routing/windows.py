"""Built-in context windows and output limits of the bundled profiles' models.

(profile, model id) → {"context_window": N, "max_output_tokens": M}; each entry with the
provider document it was checked against and the date, in a comment beside it.
"""

from __future__ import annotations

from typing import Any

BUILT_IN_WINDOWS: dict[tuple[str, str], dict[str, Any]] = {}
