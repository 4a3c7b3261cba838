"""Anthropic's server tool search (`tool_search_tool_regex_*`, `tool_search_tool_bm25_*`),
run by the proxy for the clients that send it."""
