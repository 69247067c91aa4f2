"""The tabular pipelines users build save and load as data (issue 61): ColumnTransformer (its ``output_indices_``
slices), Pipeline, the encoders, imputer and scalers, TransformedTargetRegressor with numpy ufuncs, pandas output.
Each loads with every way to unpickle refused, names no class load would refuse, holds the same state and predicts
bit for bit; what cannot be data (a lambda) is refused at save, naming where it is held and the way out."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pytest
from sklearn.compose import ColumnTransformer, TransformedTargetRegressor
from sklearn.impute import SimpleImputer
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import (
    FunctionTransformer,
    MinMaxScaler,
    OneHotEncoder,
    OrdinalEncoder,
    PowerTransformer,
    QuantileTransformer,
    RobustScaler,
    StandardScaler,
)

import glas_sklearn
from glas_sklearn import LaplaceActiveSubspaceRegressor
from glas_sklearn.serialization import ModelFileError, untrusted_names
from tests.reference import grouped
from tests.test_model_file_safety import TINY
from tests.test_serialization import assert_same_state, safe_load

pytestmark = [pytest.mark.filterwarnings("ignore::glas_sklearn.calibration.CalibrationWarning"),
              pytest.mark.filterwarnings("ignore::glas_sklearn.calibration.ConformalWarning")]


def _frame(n=60, seed=0):
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({"a": rng.normal(size=n), "b": rng.uniform(size=n), "c": rng.choice(["x", "y", "z"], n),
                       "d": rng.choice(["p", "q"], n)})
    df.loc[[3, 17], "a"] = np.nan
    return df, np.exp(0.5 * df["b"].to_numpy() + 0.1 * rng.normal(size=n))


def _reg():
    return LaplaceActiveSubspaceRegressor(**grouped(**TINY))


def _numeric_and_categorical():
    return ColumnTransformer([("num", make_pipeline(SimpleImputer(), StandardScaler()), ["a", "b"]),
                              ("cat", OneHotEncoder(handle_unknown="ignore"), ["c"]),
                              ("ord", OrdinalEncoder(), ["d"])])


def _scalers():
    return ColumnTransformer([("minmax", MinMaxScaler(), ["b"]), ("robust", RobustScaler(), ["b"]),
                              ("quantile", QuantileTransformer(n_quantiles=20), ["b"]),
                              ("power", PowerTransformer(), ["b"]),
                              ("median", SimpleImputer(strategy="median"), ["a"])])


PIPELINES = {
    "column transformer, imputer, scaler, encoders": lambda: make_pipeline(_numeric_and_categorical(), _reg()),
    "every scaler": lambda: make_pipeline(_scalers(), _reg()),
    "transformed target with numpy ufuncs": lambda: TransformedTargetRegressor(
        make_pipeline(_numeric_and_categorical(), _reg()), func=np.log1p, inverse_func=np.expm1),
    "a ufunc in a FunctionTransformer": lambda: make_pipeline(
        ColumnTransformer([("log", FunctionTransformer(np.log1p), ["b"]), ("imp", SimpleImputer(), ["a"])]), _reg()),
    "pandas output": lambda: make_pipeline(
        ColumnTransformer([("num", make_pipeline(SimpleImputer(), StandardScaler()), ["a", "b"]),
                           ("cat", OneHotEncoder(sparse_output=False), ["c"])]).set_output(transform="pandas"),
        _reg()),
}


@pytest.mark.parametrize("name", list(PIPELINES))
def test_a_tabular_pipeline_round_trips_without_unpickling(name):
    df, y = _frame()
    pipeline = PIPELINES[name]().fit(df, y)
    buffer = io.BytesIO()
    glas_sklearn.save(pipeline, buffer)
    assert untrusted_names(io.BytesIO(buffer.getvalue())) == []  # nothing to trust: load takes it as it is
    loaded = safe_load(io.BytesIO(buffer.getvalue()))
    assert_same_state(pipeline, loaded)
    np.testing.assert_array_equal(loaded.predict(df), pipeline.predict(df), strict=True)
    inner = loaded.regressor_ if isinstance(loaded, TransformedTargetRegressor) else loaded
    want = pipeline.regressor_ if isinstance(pipeline, TransformedTargetRegressor) else pipeline
    for got, expected in zip(inner[-1].predict_interval(inner[:-1].transform(df)),
                             want[-1].predict_interval(want[:-1].transform(df)), strict=True):
        np.testing.assert_array_equal(got, expected, strict=True)
    if name == "pandas output":
        pd.testing.assert_frame_equal(inner[0].transform(df), want[0].transform(df), check_exact=True)


def _double(x):
    return 2 * x


def test_a_lambda_is_refused_at_save_naming_the_step_and_the_way_out():
    df, y = _frame()
    pipeline = make_pipeline(ColumnTransformer([("f", FunctionTransformer(lambda x: 2 * x), ["b"])]), _reg())
    pipeline.fit(df, y)
    with pytest.raises(ModelFileError, match=r"estimator\.steps\[0\]\[1\]\.transformers\[0\]\[1\]\.func is the "
                                             r"function .*<lambda>.*holds data, not code.*top level of a module"
                                             r".*trusted=.*"
                                             r"np\.log1p"):
        glas_sklearn.save(pipeline, io.BytesIO())


def test_a_users_function_loads_only_when_trusted():
    """A FunctionTransformer holding a user's top-level function saves by its import path; load refuses it until
    trusted names it, and then predicts bit for bit."""
    df, y = _frame()
    pipeline = make_pipeline(ColumnTransformer([("f", FunctionTransformer(_double), ["b"])]), _reg()).fit(df, y)
    buffer = io.BytesIO()
    glas_sklearn.save(pipeline, buffer)
    names = untrusted_names(io.BytesIO(buffer.getvalue()))
    assert names == [f"{__name__}._double"]
    with pytest.raises(ModelFileError, match="_double, which glas_sklearn.load does not trust"):
        safe_load(io.BytesIO(buffer.getvalue()))
    loaded = safe_load(io.BytesIO(buffer.getvalue()), trusted=names)
    np.testing.assert_array_equal(loaded.predict(df), pipeline.predict(df), strict=True)
