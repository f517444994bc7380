"""``train_gkd`` through its KFP python function: a dataset prepared for another technique is refused.

Training itself runs end to end in ``tests/pipelines/test_kfp_local_post_training.py`` (``technique=gkd``).
"""

import pytest
from kfp.dsl import Artifact, Dataset, Markdown, Metrics, Model

from components.train_gkd.component import train_gkd
from posttrain.kfp.artifacts import PipelineStepError


def test_a_dataset_prepared_for_another_technique_is_refused(tmp_path, prepared_sao):
    with pytest.raises(PipelineStepError, match="prepared for technique 'sao', not 'gkd'"):
        train_gkd.python_func(prepared=Dataset(uri=str(prepared_sao)), run_id="run-gkd",
                              model=Model(uri=str(tmp_path / "model")), metrics=Metrics(uri=str(tmp_path / "metrics")),
                              report=Markdown(uri=str(tmp_path / "report.md")), time_account=Markdown(uri=str(tmp_path / "account.md")), time_account_plot=Artifact(uri=str(tmp_path / "account.png")))
