"""The container test (`make test-container`, `python -m tests.container`): a real image,
built and run by a real engine. Not collected by pytest: it needs docker or podman."""
