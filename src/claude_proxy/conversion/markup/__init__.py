"""Tool-call markup that models write as text when the server's tool parser missed it: one
module per format (Qwen3-Coder's XML and the Hermes JSON, DeepSeek's DSML and special tokens,
Kimi's section tokens, GLM's `<arg_key>`/`<arg_value>`, MiniMax's `<invoke>`, gpt-oss's
harmony). Each reads one envelope into the calls it proposes; `conversion/text_tool_calls.py`
finds the envelopes in a stream and checks the calls. docs/text-tool-calls.md names the
threads each shape comes from."""
