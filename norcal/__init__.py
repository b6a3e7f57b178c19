"""norcal-deploy: NorCal long-tail calibration baked into deployed detectors."""

__version__ = "0.1.0"
