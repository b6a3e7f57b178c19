"""One NorCal calibration, from the CLI to the node and back: :class:`Calibration`.

The CLI and the library build it from the user's options; a detectron2 config's
``TEST.CALIBRATION`` keys give one too (``ModelSpec.calibration``). :meth:`Calibration.resolve`
loads its table once and checks it against the model's class count; the surgery bakes the
resolved calibration in and writes it to the graph's metadata
(:func:`norcal.core.calibration.meta.calibration_metadata`); reading a calibrated graph gives it
back (:func:`norcal.core.calibration.meta.calibration_from_metadata`, with the prior as stored),
which is what the PyTorch reference runs with for parity.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import numpy as np

from norcal.core.calibration.formula import check_gamma, check_variant, log_prior
from norcal.core.errors import NorcalError
from norcal.core.calibration.tables import CalibrationTable, builtin_names, load_table

DEFAULT_BACKGROUND = "last"  # detectron2's slot, when neither the user nor the model says


def default_table(num_classes: int) -> CalibrationTable:
    """The built-in table with exactly ``num_classes`` classes (LVIS v1: 1203, v0.5: 1230)."""
    for name in builtin_names():
        t = load_table(name)
        if t.num_classes == num_classes:
            return t
    raise NorcalError(f"none of the built-in class counts (LVIS v1: 1203, v0.5: 1230) is for "
                      f"{num_classes} classes; pass table (the training annotations, or a JSON of "
                      "counts built from them)", param="table")


@dataclass(frozen=True)
class Calibration:
    """The calibration to bake in: p(c) = softmax(logits - log a)_c, a_c from ``table``'s N_c.

    gamma: >= 0 (ENS: in [0, 1)); 0 is the plain softmax; None: a checkpoint's config must name
    it (TEST.CALIBRATION). table: a built-in name (lvis_v1, lvis_v0_5), a table JSON, a training
    annotation file or a :class:`CalibrationTable`; None: the built-in table matching the class
    count. factor: "cdt" (a_c = N_c^gamma) or "ens"; mechanism: "exp", "prob" or "logit" (see
    :mod:`norcal.core.calibration.formula`). count: which counts are N_c, "image" or "instance" (None:
    the table's). background: where the background logit is, "last" (detectron2), "first"
    (torchvision) or "none" (None: what the export recorded, a RetinaNet none, else last).
    logits: ONNX input only, the classifier logits tensor when it is not found automatically.
    inline: plain ops instead of the ``ai.norcal::NorCal`` function node. min_count: counts
    below it are raised to it.

    Filled in on the way: ``activation`` (the classifier's, once the node is placed) and, for a
    calibration read back from a graph, ``stored_prior`` (the prior exactly as the graph holds
    it) and ``table_sha256`` / ``num_classes`` / ``min_count_clamped`` from its metadata.
    """

    gamma: float | None
    table: str | os.PathLike | CalibrationTable | None = None
    factor: str = "cdt"
    mechanism: str = "exp"
    renormalize: bool | None = None  # None: the classifier's own form
    background_scale: float = 1.0
    count: str | None = None
    background: str | None = None
    logits: str | None = None
    inline: bool = False
    min_count: float | None = None
    activation: str | None = None  # softmax | sigmoid: the activation the node replaces
    stored_prior: np.ndarray | None = dataclasses.field(default=None, compare=False, repr=False)
    table_sha256: str | None = None  # read back from a graph (a resolved one has its table's)
    num_classes: int | None = None  # likewise
    min_count_clamped: int | None = None  # likewise

    # -- resolving ---------------------------------------------------------------------------
    def resolve(self, num_classes: int | None) -> "ResolvedCalibration":
        """This calibration with gamma checked, its background slot set (None: last), its table
        loaded (None: the built-in one for ``num_classes``) and its log prior computed; a table for
        another class count than ``num_classes`` (when known) is refused."""
        if self.gamma is None:
            raise NorcalError("gamma is required (0 gives the plain softmax)", param="gamma")
        check_gamma(self.gamma, self.factor)
        table = self.table
        if table is None:
            if num_classes is None:
                raise NorcalError("cannot tell the model's class count; pass table", param="table")
            table = default_table(num_classes)
        elif not isinstance(table, CalibrationTable):
            table = load_table(table)
        if num_classes is not None and table.num_classes != num_classes:
            raise NorcalError(f"table {table.name!r} has {table.num_classes} classes but the model has "
                              f"{num_classes} (background not counted)", param="table")
        counts, clamped = table.clamped_counts(self.count, self.min_count)  # validates the counts
        background = self.background or DEFAULT_BACKGROUND
        # computed now, so a gamma beyond float32 is refused before a checkpoint's export
        prior = log_prior(counts, self.gamma, self.factor, background, self.background_scale, table.names)
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(Calibration)}
        fields.update(gamma=float(self.gamma), table=table, count=self.count or table.count_type,
                      background=background, table_sha256=table.sha256, num_classes=table.num_classes,
                      min_count_clamped=None if self.min_count is None else clamped)
        return ResolvedCalibration(**fields, prior=prior)

    @property
    def resolved_table(self) -> CalibrationTable:
        if not isinstance(self.table, CalibrationTable):
            raise NorcalError("the calibration's table is not loaded (resolve it first)")
        return self.table

    @property
    def table_name(self) -> str:
        t = self.table
        return t.name if isinstance(t, CalibrationTable) else ("" if t is None else str(t))

    def with_background(self, background: str) -> "Calibration":
        return dataclasses.replace(self, background=background)

    def with_activation(self, activation: str) -> "Calibration":
        """This calibration for a classifier with that activation (the variant is checked)."""
        out = dataclasses.replace(self, activation=activation)
        out.renormalized  # noqa: B018 - refuses a variant that does not exist
        return out

    @property
    def renormalized(self) -> bool:
        """Whether the scores are renormalised (None resolved for the activation)."""
        return check_variant(self.mechanism, self.renormalize, self.activation or "softmax")

    def log_prior(self) -> np.ndarray:
        """The node's constant, float64 [K]: the stored prior when read back from a graph (a
        resolved calibration has the one it computed)."""
        if self.stored_prior is None:
            raise NorcalError("the calibration's prior is not computed (resolve it first)")
        return np.asarray(self.stored_prior, dtype=np.float64)

    def describe(self) -> str:
        return (f"NorCal gamma {'?' if self.gamma is None else float(self.gamma)} ({self.factor}, "
                f"{self.mechanism}, table {self.table_name or '?'})")


@dataclass(frozen=True)
class ResolvedCalibration(Calibration):
    """A :class:`Calibration` after :meth:`Calibration.resolve`: its table loaded and fitted to the
    class count, its background slot set and its log prior (``prior``) computed, once."""

    prior: np.ndarray | None = dataclasses.field(default=None, compare=False, repr=False)

    def resolve(self, num_classes: int | None) -> "ResolvedCalibration":
        """Itself (nothing is loaded again); a class count other than its table's is refused."""
        if num_classes is not None and num_classes != self.num_classes:
            raise NorcalError(f"table {self.table_name!r} has {self.num_classes} classes but the model has "
                              f"{num_classes} (background not counted)", param="table")
        return self

    def with_background(self, background: str) -> "Calibration":
        raise NorcalError("a resolved calibration's background is fixed (its prior depends on it)",
                          param="background")

    def log_prior(self) -> np.ndarray:
        return np.asarray(self.prior, dtype=np.float64)
