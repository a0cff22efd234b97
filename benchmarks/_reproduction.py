# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""What the reproduction scripts (`reproduce_cold_start.py`, `reproduce_reward_model.py`) share: quiet transformers
in their worker processes, and how a finished figure is titled and written."""

import os

from transformers.utils import logging as hf_logging


def quiet_transformers() -> None:
    """Errors only, no progress bars (many short runs would flood the terminal)."""
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def save_figure(fig, path: str, title: str, dpi: int) -> None:
    """Title `fig`, lay it out, write it to `path` (creating its folder) and close it."""
    import matplotlib.pyplot as plt  # optional: only the plots need it

    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
