"""Records -> tables, plots, HTML, advice, notebook helpers (no JAX)."""
