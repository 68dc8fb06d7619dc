"""Measured auto against the best correct backend on held-out shapes; advise on the H200."""
