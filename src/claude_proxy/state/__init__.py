"""What the proxy learns at run time, in one place: in-process by default, shared through
Redis across workers and replicas when REDIS_URL is set (see store.py)."""
