"""Raw-corpus readers (ecg-arrhythmia/Ningbo WFDB, CODE-15 HDF5) and HDF5 shard building."""
