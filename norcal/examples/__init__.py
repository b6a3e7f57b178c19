"""Example data shipped with the package: ``d2_synth_trained/`` (see its README.md), the
long-tailed Mask R-CNN, training subset and validation images that ``norcal demo`` runs on."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent
