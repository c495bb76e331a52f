"""The engines' lifecycle between the repository and the pool: each voice's versions verified,
swapped in and rolled out to the workers (``swapper``), and the voices served (``catalog``)."""
