"""Early warning (docs/health.md): cheap health signals of a running trial, a verdict at a
configured step from rules kept as data (conf/health/), and the early stop that acts on it."""
