"""A model's chat template: rendering it safely, and what probing it tells (system role, thinking
switch, reasoning format). Both backends and the history builder rely on it, so they agree."""
