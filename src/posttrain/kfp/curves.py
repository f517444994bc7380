"""The reward curve of a training run as a self-contained HTML page (PNG inline), for the KFP UI.

``reward_curve_page`` reads the ``reward/mean`` history (mean episode reward of each optimizer
step's batch, logged by the SAO and GRPO learners) of an MLflow run and draws it with matplotlib
(Agg backend, no display) into a PNG embedded as a ``data:`` URI, so the KFP UI's HTML viewer
shows it without reaching MLflow. The page also links the run.

Try it on a finished run: ``python -c "from posttrain.kfp.curves import reward_curve_page;
print(reward_curve_page('sqlite:///runs/mlflow.db', '<run id>', 'demo')[:200])"``.
"""

from __future__ import annotations

import base64
import html
import io

REWARD_METRIC = "reward/mean"
"""Metric drawn: mean reward of the rollouts of each optimizer step (x axis: step = policy version)."""


def reward_png(points: list[tuple[int, float]], title: str) -> bytes:
    """A 6.4 x 3.6 inch PNG (100 dpi) of ``(step, reward)`` points as a line with markers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
    try:
        ax.plot([s for s, _ in points], [v for _, v in points], marker="o")
        ax.set_xlabel("policy version (optimizer step)")
        ax.set_ylabel("mean reward of the step's rollouts")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", bbox_inches="tight")
    finally:
        plt.close(fig)
    return buf.getvalue()


def reward_curve_page(tracking_uri: str, run_id: str, run_name: str) -> str:
    """An HTML page with the ``reward/mean`` curve of MLflow run ``run_id`` and a link to the run.

    A run that logged no reward yet gets a page that says so (no image).

    Raises:
        posttrain.tracking.TrackingError: the run does not exist.
    """
    from posttrain.tracking import metric_history, run_link

    points = metric_history(tracking_uri, run_id, REWARD_METRIC)
    link = run_link(tracking_uri, run_id)
    shown = (f"<a href='{html.escape(link)}'>{html.escape(link)}</a>" if link.startswith("http")
             else html.escape(link))
    if points:
        png = base64.b64encode(reward_png(points, f"{run_name}: {REWARD_METRIC}")).decode("ascii")
        body = (f"<img alt='{REWARD_METRIC} per policy version' src='data:image/png;base64,{png}'>"
                f"<p>{len(points)} steps; first {points[0][1]:.4f}, last {points[-1][1]:.4f}.</p>")
    else:
        body = f"<p>The run logged no {REWARD_METRIC}.</p>"
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>Reward curve {html.escape(run_name)}</title>"
            f"</head><body><h1>Reward curve: {html.escape(run_name)}</h1>{body}<p>MLflow run: {shown}</p></body></html>\n")
