"""The live dashboard at /ui: the recorder (memory), the inspector views, the routes."""
