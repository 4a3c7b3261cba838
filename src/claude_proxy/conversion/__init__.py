"""Pure conversions between the Anthropic Messages API and OpenAI Chat Completions.

Nothing in this package does I/O: dicts in, dicts (or events) out.
"""
