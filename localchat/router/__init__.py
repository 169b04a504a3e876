"""Several models on one port: requests routed by name to one engine child per loaded model,
admitted by the memory estimate and unloaded when idle (docs/router.md)."""
