"""The measuring engine's own cost: the peers sweep cell by cell, a cold lab run."""
