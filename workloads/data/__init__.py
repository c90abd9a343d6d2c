"""Training data: where the rows come from (`load`), how a row of each format becomes text
segments with a loss mask (`formats`), and the checks run before training (`checks`)."""
