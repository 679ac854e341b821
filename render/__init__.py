"""Rich views of the engine's step events."""
