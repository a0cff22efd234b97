# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Sampling completions: transformers' `generate` with a shared prompt prefix, and the CPU decoding speed-ups around it."""
