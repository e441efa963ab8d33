"""What `vit fit` prints (`vit.cli.console`): the parameter count of the model and the narrow noise filters."""

from __future__ import annotations

import logging

from torch import nn

from vit.cli.console import count_parameters, quiet_dependencies


def test_parameters_are_counted_trainable_and_frozen():
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))  # 16 + 10 parameters
    model[0].requires_grad_(False)
    assert count_parameters(model) == (10, 16)


def test_only_the_named_messages_are_dropped_and_the_filter_is_added_once():
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    before = list(logger.filters)
    try:
        quiet_dependencies()
        quiet_dependencies()
        added = [f for f in logger.filters if f not in before]
        assert len(added) <= 1 and len(logger.filters) == len(before) + len(added)
        record = lambda msg: logging.LogRecord(logger.name, logging.INFO, __file__, 1, msg, None, None)
        assert not logger.filter(record("💡 Tip: For seamless cloud logging, try ..."))
        assert logger.filter(record("Trainer will use only 1 of 2 GPUs"))  # anything else still shows
    finally:
        logger.filters[:] = before
