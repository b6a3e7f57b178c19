"""NorCal's calibration: the formula, one calibration's settings and its metadata, the
count tables, the classifier option."""
