"""Several providers in one proxy: the config file, the providers, the router, their health."""
