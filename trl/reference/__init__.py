# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""The reference model of iterative GRPO: how tensors are laid out over ranks, how the reference is synced with the policy, kept out of memory, and saved in checkpoints."""
