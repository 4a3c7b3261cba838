"""The upstream APIs: each one's request builder and wire parser (pure), and the client."""
