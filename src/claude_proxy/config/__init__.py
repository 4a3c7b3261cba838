"""What the operator configured: the process settings and provider profiles, the config file,
the per-model table (windows and prices) and the key tables. The bottom of the house: it
imports nothing of the proxy's but itself."""
