"""Benchmark of claude-proxy against a direct OpenAI-format baseline (`make bench`)."""
