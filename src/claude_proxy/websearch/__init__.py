"""Claude Code's WebSearch (the Anthropic `web_search_*` server tool) run by the proxy:
search backends (`backends.py`), the Anthropic blocks (`blocks.py`), provider-native search
(`native.py`) and the flow of one search request (`flow.py`)."""
