"""The report's training plot: the final evaluation of the restored best model is a marker,
not a line back from the last step; the smoothed loss is a trailing mean."""

from __future__ import annotations


import numpy as np

from pipeline.report import _plot_training, smoothed, split_final_points


def test_the_end_of_run_evaluation_at_the_best_step_is_kept_off_the_curve():
    # Periodic validation at 100..400, best at 200; the run's model is then evaluated at 200.
    points = [(100, 0.70), (200, 0.75), (300, 0.74), (400, 0.73), (200, 0.75)]
    assert split_final_points(points) == (points[:4], [(200, 0.75)])
    assert split_final_points([(400, 0.7)]) == ([(400, 0.7)], [])
    # Without early stopping the last evaluation repeats the last step: a marker as well.
    assert split_final_points([(100, 0.7), (200, 0.72), (200, 0.72)])[1] == [(200, 0.72)]


def test_the_smoothed_loss_is_a_trailing_mean_of_the_window():
    values = [4.0, 2.0, 6.0, 0.0, 8.0]
    assert np.allclose(smoothed(values, 2), [4.0, 3.0, 4.0, 3.0, 4.0])
    assert np.allclose(smoothed(values, 1), values)
    assert np.allclose(smoothed(values, 10), np.cumsum(values) / np.arange(1, 6))


def test_the_plot_draws_the_final_evaluation_as_a_marker(tmp_path, monkeypatch):
    drawn = []
    import matplotlib.axes

    real_plot = matplotlib.axes.Axes.plot

    def recording_plot(self, *args, **kwargs):
        drawn.append((self.get_title(), [list(a) for a in args[:2]], kwargs))
        return real_plot(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", recording_plot)
    metrics = [{"step": s, "loss": 0.5 - s / 1e4} for s in range(1, 401)]
    metrics += [
        {"event": "eval", "split": "validation", "step": s, "auc": a}
        for s, a in [(100, 0.70), (200, 0.75), (300, 0.74), (400, 0.73), (200, 0.75)]
    ]
    out = tmp_path / "training.png"
    assert _plot_training(metrics, out) and out.stat().st_size > 0
    curves = [d for d in drawn if d[2].get("marker") == "o"]
    assert [c[1][0] for c in curves] == [[100, 200, 300, 400]]
    markers = [d for d in drawn if d[2].get("marker") == "*"]
    assert [m[1] for m in markers] == [[[200], [0.75]]] and markers[0][2]["ls"] == "none"
    assert len([d for d in drawn if len(d[1]) == 2 and len(d[1][0]) == 400]) == 2  # raw, smoothed
