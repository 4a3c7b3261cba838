"""The HTTP edge: the application, its routes, the access log, the streamed response, and
the tweak to uvicorn's HTTP protocol. The only layer that knows HTTP framing."""
