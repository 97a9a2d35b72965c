"""`ecgpos demo`: the whole pipeline on synthetic ECGs written in the real corpora's layouts."""
