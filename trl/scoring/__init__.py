# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""Scoring completions with a model: per-token log-probs and entropies, and the layouts and memory savers of those passes (shared prompts, packing, chunked log-probs, tied gradients, recomputed activations)."""
