"""The warm start: scripted transcripts of the built-in agent, supervised through the trainer's loss."""
