"""P2 (METHODS.md): BiPA, evaluating skill optimizers: optimizer, acceptance-rule replay, episode graph, report."""
