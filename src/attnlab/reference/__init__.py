"""The truth and the judge: float64 NumPy references, the blockwise device reference, input draws."""
