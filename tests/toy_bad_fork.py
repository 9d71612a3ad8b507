"""Imported ahead by a forking process in a test (autocompile.trial.prestart): torch then marks each
child forked from it as in a "bad fork", as it does once CUDA has started in the parent, which the
CPU build cannot do."""

import torch

torch.cuda._is_in_bad_fork = lambda: True
