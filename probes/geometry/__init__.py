"""`ecgpos geometry`: the PoS representation dynamics between consecutive levels of a nested encoder, and the
carving criterion: the command (`cli`), the metrics (`dynamics`) and its summary, table and figures (`report`)."""
