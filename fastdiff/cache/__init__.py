"""Feature caching and step reuse: DeepCache, block caching, prompt cache, step forecasting."""
