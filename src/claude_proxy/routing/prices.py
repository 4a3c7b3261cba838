"""Built-in prices of the bundled profiles' default models, USD per million tokens.

(profile, model id) → {"price_input": …, "price_output": …, "price_cache_read": …,
"price_cache_write": …}; each entry with the provider's price page and the date, in a comment.
"""

from __future__ import annotations

from typing import Any

BUILT_IN_PRICES: dict[tuple[str, str], dict[str, Any]] = {}
