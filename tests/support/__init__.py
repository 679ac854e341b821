"""What the tests share: random checkpoints, varied prompts, the transformers reference, accounting checks,
the CLI and server harnesses, trace samples and the headless browser."""
