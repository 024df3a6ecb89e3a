"""The gpu-aware host scores (docs/gpu-aware.md): what a placement costs each node's usable GPU
capacity, blended into the binpack/spread score.

The blend needs the cards the full fit chooses, so no quick fit serves it. Until a node changes
(its generation), its usable capacity is kept on its view (`NodeView.aware`, gone with the view),
and the host score of each quick pod's shape, so a queue of pods of a few shapes pays the full fit
once per node and shape.
"""

from __future__ import annotations

from collections.abc import Callable

from deviceplugin.extender.inventory import QUICK_SHAPES, AwareKept, NodeView
from deviceplugin.fit import FitResult
from deviceplugin.fit.family import PodRequest
from deviceplugin.fit.fragment import Sharing, Weights, blend, fragment, usable


class AwareScores:
    """Host scores with the gpu-aware score blended in by `weights`, per node."""

    def __init__(self, weights: Weights, sharing: Sharing) -> None:
        self.weights = weights
        self.sharing = sharing

    def score(
        self,
        view: NodeView,
        request: PodRequest,
        shape: int,
        *,
        fit: Callable[[], FitResult],
        base: Callable[[FitResult], float],
        scaled: Callable[[float], int],
    ) -> int:
        """The node's host score for a pod: `fit()` (called under `view.lock`) chooses its cards,
        `base` gives the fit's binpack/spread score per device, `scaled` the host score of a blend.
        A quick pod's shape is read without the lock, as `QuickFits`."""
        kept = view.aware  # replaced under the node's lock
        if request.quick and kept is not None and kept.generation == view.generation:
            score = kept.scores.get(shape)
            if score is not None:
                return score
        with view.lock:
            if kept is None or kept.generation != view.generation:
                kept = view.aware = AwareKept(view.generation, usable(view.gpus, view.topology, self.sharing))
            result = fit()
            score = 0
            if result.ok:
                placed = fragment(view.gpus, result.devices, view.topology, self.sharing, kept.before)
                score = scaled(blend(base(result), placed, self.weights))
            if request.quick:
                if len(kept.scores) >= QUICK_SHAPES:
                    kept.scores.clear()
                kept.scores[shape] = score
        return score
