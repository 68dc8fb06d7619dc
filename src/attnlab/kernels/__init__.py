"""attnlab's own kernels, written in Pallas (see each module's docstring)."""
