"""Engine: token-in/token-out inference engine of one rollout cell."""
