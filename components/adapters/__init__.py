"""What an adapter changed in a base model: per-module weight deltas (`audit`) and what they do to
the next-token distribution (`lens`)."""
