"""Linear-probe evaluation of frozen ECG encoders (MERL's splits and protocol): `ecgpos probe`; and,
on the same tasks and data, the PoS representation dynamics between two levels: `ecgpos geometry`."""
