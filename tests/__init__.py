"""The test suite: one folder per part of the engine it specifies, helpers in tests/support."""
