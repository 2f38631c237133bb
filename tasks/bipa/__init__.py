"""P2 (docs/methods/p2-bipa.md): BiPA, evaluating skill optimizers: optimizer, acceptance-rule
replay, episode graph, report."""
