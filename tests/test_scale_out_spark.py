"""The Spark recipe on a local session (``local[2]``, bound to 127.0.0.1): ``mapInPandas`` with
:func:`glas_sklearn.scale_out.batch_predictor` gives the in-process predictions, the model file loaded once per
executor process. Needs pyspark and Java; skipped, saying which is missing, without them."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import glas_sklearn
from glas_sklearn import LaplaceActiveSubspaceRegressor, LowRank, Training
from glas_sklearn.scale_out import batch_predictor, output_schema, worker_cache_info

pytest.importorskip("pyspark", reason="needs pyspark (pip install 'glas-sklearn[spark]')")
pytest.importorskip("pyarrow", reason="needs pyarrow for mapInPandas (pip install 'glas-sklearn[spark]')")
if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
    pytest.skip("needs Java for a local Spark session (apt-get install -y default-jre-headless)",
                allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]
ATOL = 1e-6


@pytest.fixture(scope="module")
def spark():
    from pyspark.sql import SparkSession

    saved = {k: os.environ.get(k) for k in ("SPARK_LOCAL_IP", "PYTHONPATH", "PYSPARK_PYTHON")}
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), saved["PYTHONPATH"] or ""])  # the executors' import
    os.environ["PYSPARK_PYTHON"] = os.environ.get("PYSPARK_PYTHON") or __import__("sys").executable
    session = (SparkSession.builder.master("local[2]").appName("glas-sklearn-test")
               .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
               .config("spark.python.worker.reuse", "true").getOrCreate())
    try:
        yield session
    finally:
        session.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_map_in_pandas_gives_the_in_process_intervals(spark, tmp_path):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 3))
    y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=300)
    reg = LaplaceActiveSubspaceRegressor(training=Training(max_epochs=5), posterior=LowRank(max_components=3),
                                         random_state=0).fit(X, y)
    path = tmp_path / "model.glas"
    glas_sklearn.save(reg, path)
    frame = pd.DataFrame(X, columns=["a", "b", "c"]).assign(id=np.arange(300))
    features = ["a", "b", "c"]
    schema = output_schema(path, "predict_interval", frame[features].iloc[:2], confidence_level=[0.5, 0.9])
    assert schema.split(", ")[:2] == ["`y_pred` double", "`y_pis_0_0` double"]
    predict = batch_predictor(path, "predict_interval", feature_columns=features, keep_columns=["id"],
                              confidence_level=[0.5, 0.9])
    out = (spark.createDataFrame(frame).repartition(4).mapInPandas(predict, f"id long, {schema}").toPandas()
           .sort_values("id"))
    assert out["id"].tolist() == list(range(300))
    ref_pred, ref_pis = reg.predict_interval(X, confidence_level=[0.5, 0.9])
    np.testing.assert_allclose(out["y_pred"].to_numpy(), ref_pred, atol=ATOL, rtol=0)
    for bound in (0, 1):
        for level in (0, 1):
            np.testing.assert_allclose(out[f"y_pis_{bound}_{level}"].to_numpy(), ref_pis[:, bound, level],
                                       atol=ATOL, rtol=0)
    # executors are Python worker processes of their own: each loaded the file at most once for 4 partitions
    loads = (spark.sparkContext.parallelize(range(4), 2)
             .mapPartitions(lambda _: [worker_cache_info()]).collect())
    assert all(info["pid"] != os.getpid() for info in loads)
    assert all(n == 1 for info in loads for n in info["loads"].values())
