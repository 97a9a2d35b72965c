"""Linear-probe evaluation of frozen ECG encoders (MERL's splits and protocol): `ecgpos probe`."""
