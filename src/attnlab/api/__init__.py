"""The public calls: attention, decode_attention, sharded_attention, explain, auto (static rule + dispatch table)."""
