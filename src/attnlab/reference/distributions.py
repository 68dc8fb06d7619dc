"""The import path of the named input distributions (``make_qkv``, ``DISTRIBUTIONS``), defined in ``inputs.py``.

They live in ``attnlab.reference.inputs``, beside the standard-normal draw they start from."""
from .inputs import (CHANNEL_GAIN, DISTRIBUTIONS, KEY_SHIFT, N_CHANNELS, OUTLIER_FRACTION, OUTLIER_STD,  # noqa: F401
                     key_shift, make_qkv, outlier_channels)
