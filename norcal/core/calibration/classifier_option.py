"""The ``classifier`` option: a box classifier's activation, named by the user for a checkpoint
whose weights cannot tell it.

detectron2's softmax and sigmoid (``MODEL.ROI_BOX_HEAD.USE_SIGMOID_CE``) R-CNN box predictors
hold the same weights (num_classes + 1 outputs), so a checkpoint without its config (and without
the federated-loss buffer only sigmoid heads carry) is refused unless the option says which it
is. A family whose weights or design fix the activation takes no such option.
"""

from __future__ import annotations

from typing import Literal

from norcal.core.errors import NorcalError, shown

SOFTMAX, SIGMOID = "softmax", "sigmoid"
ACTIVATIONS = (SOFTMAX, SIGMOID)

ClassifierActivation = Literal["softmax", "sigmoid"]


def check_classifier(value) -> ClassifierActivation | None:
    """``value`` when it is None or one of :data:`ACTIVATIONS`; anything else refused, naming
    the parameter."""
    if value is not None and value not in ACTIVATIONS:
        raise NorcalError(f"classifier must be {' or '.join(ACTIVATIONS)}, got {shown(value)}", param="classifier")
    return value
